"""Benchmark: a table filter through the worker on a real broker.

    python benchmarks/table_filter.py            # local Tansu broker, 200,000 records
    python benchmarks/table_filter.py --records 500000 --bootstrap-servers host:9092

Loads N JSON records (50,000 keys, so most are updates) into a 4-partition topic, then runs
``orders.filter(amount > 100).to_stream().to(out)`` through the worker until the input is
drained. Throughput is measured from the first record processed to the last (the group join is
excluded). For scale, the same run also times a bare confluent-kafka consume-filter-produce loop
with no state, no deserialization and no table semantics (the ceiling of any Python worker here).

``--reuse-source-topics both`` (the default) runs the worker twice over the same input: with the
table's own changelog topic, and with the source topic as its changelog
(``build(reuse_source_topics=True)``: no changelog record per update).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402
from processor.serde import Serdes  # noqa: E402


def load(bootstrap, topic, n, keys):
    rnd = random.Random(42)
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(n):
        k = f"order-{rnd.randrange(keys)}"
        v = json.dumps({"amount": rnd.randrange(200), "customer": f"c{rnd.randrange(1000)}", "seq": i},
                       sort_keys=True, separators=(",", ":")).encode()
        produce(p, topic, v, k.encode(), 1_700_000_000_000 + i)
    p.flush()


def topology(inp, out, reuse_source_topics=False):
    b = StreamsBuilder()
    b.table(inp, key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .filter(lambda k, v: v["amount"] > 100).to_stream().to(out)
    return b.build(reuse_source_topics=reuse_source_topics)


def raw_loop(bootstrap, inp, out, n):
    conf = kafka.consumer_defaults(bootstrap)
    conf.update({"group.id": "bench-raw", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c = Consumer(conf)
    p = Producer(kafka.producer_defaults(bootstrap))
    c.subscribe([inp])
    seen = 0
    first = None
    while seen < n:
        for m in c.consume(1000, 0.1):
            if m.error():
                continue
            if first is None:
                first = time.monotonic()
            seen += 1
            v = m.value()
            if b'"amount":1' in v:
                p.produce(out, v, m.key())
        p.poll(0)
    p.flush()
    dt = time.monotonic() - first
    c.close()
    return seen / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--on-error", default="dlq",
                    help="on-error policy, or several comma-separated: one worker run each over the same "
                         "input (dlq and skip journal every store write so a failed record can be undone; "
                         "fail does not), e.g. dlq,fail")
    ap.add_argument("--reuse-source-topics", choices=("off", "on", "both"), default="both",
                    help="the table's changelog: its own topic (off), the source topic (on), or one run "
                         "of each (both, the default)")
    args = ap.parse_args()
    reuse = {"off": [False], "on": [True], "both": [False, True]}[args.reuse_source_topics]
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        inp, out, raw_out = f"bench-orders-{run_id}", f"bench-big-orders-{run_id}", f"bench-raw-out-{run_id}"
        kafka.create_topics(bootstrap, {inp: 4, out: 4, raw_out: 4})
        t0 = time.monotonic()
        load(bootstrap, inp, args.records, args.keys)
        print(f"loaded {args.records:,} records into {inp} (4 partitions) in {time.monotonic() - t0:.1f} s")
        rates = {}
        runs = [(policy, r) for policy in args.on_error.split(",") for r in reuse]
        for i, (policy, r) in enumerate(runs):
            label = f"--on-error {policy}, changelog: {'the source topic' if r else 'its own topic'}"
            sink_topic = out if i == 0 else f"{out}-{policy}-{i}"
            if i:
                kafka.create_topics(bootstrap, {sink_topic: 4})
            with tempfile.TemporaryDirectory() as state:
                w = Worker(topology(inp, sink_topic, r), bootstrap, f"bench-{run_id}-{i}", state, on_error=policy,
                           consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
                t0 = time.monotonic()
                w.run(until_drained=True, install_signal_handlers=False)
                dt = w.last_record_at - w.first_record_at
                rate = w.records_processed / dt
                rates.setdefault(label, []).append(rate)
                m = w.metrics()
            print(f"worker ({label}): {w.records_processed:,} records in {dt:.2f} s (group join "
                  f"and startup {w.first_record_at - t0:.1f} s excluded)")
            src = next(v for k, v in m.items() if k.startswith("KTABLE-SOURCE"))
            flt = next(v for k, v in m.items() if k.startswith("KTABLE-FILTER"))
            sink = next(v for k, v in m.items() if k.startswith("KSTREAM-SINK"))
            print(f"  no-op updates skipped: {src['noop_updates_skipped']:,}; filtered on both sides: "
                  f"{flt['skipped_both_fail']:,}; records out: {sink['records_out']:,}")
            print(f"table filter through the worker ({label}): {rate:,.0f} records/s")
        if len(rates) > 1:
            med = {p: statistics.median(r) for p, r in rates.items()}
            first = next(iter(med))
            print("  in this run: " + "; ".join(f"{p}: {r:,.0f} records/s ({r / med[first]:.2f}x the first)"
                                               for p, r in med.items()))
        if not args.no_baseline:
            raw = raw_loop(bootstrap, inp, raw_out, args.records)
            print(f"bare consume-filter-produce loop (no state, no serdes): {raw:,.0f} records/s; "
                  f"worker/bare = {rate / raw:.2f}")


if __name__ == "__main__":
    main()
