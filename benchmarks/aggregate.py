"""Benchmark: a count through a repartition topic, through the worker on a real broker.

    python benchmarks/aggregate.py               # local Tansu broker, 200,000 records
    python benchmarks/aggregate.py --records 500000 --emit every --bootstrap-servers host:9092
    python benchmarks/aggregate.py --guarantee both   # exactly_once's cost: both on the same input

Loads N JSON click events (keyed by user, 1,000 pages, Zipf-like skew) into a 4-partition topic,
then runs ``clicks.group_by(page).count(emit=...)`` to an output topic until drained: every input
record is consumed, re-keyed, produced to the repartition topic, consumed again, counted in
RocksDB (value + last-emitted column) and, per the emission policy, produced to the output.
Throughput is input records per second from the first record processed to the last (the group
join excluded). For scale: Quix Streams was measured at ~30k records/s on a count through a
repartition on this machine kind (docs/architecture.md).

``--guarantee both`` runs the same input under ``at_least_once`` and then ``exactly_once`` (one
transaction per commit; on the local Tansu broker read uncommitted, as docs/semantics.md prescribes for
it) and prints the ratio of the two rates (target: exactly_once costs at most 1.5x).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import Emit, StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402

POLICIES = {"on_update": Emit.on_update(), "on_change": Emit.on_change(), "every": Emit.every(1000)}


def load(bootstrap, topic, n):
    rnd = random.Random(42)
    pages = [f"/page/{i}" for i in range(1000)]
    weights = [1 / (i + 1) for i in range(1000)]
    p = Producer(kafka.producer_defaults(bootstrap))
    chosen = rnd.choices(pages, weights, k=n)
    for i in range(n):
        v = json.dumps({"page": chosen[i], "ms": rnd.randrange(5000)}, separators=(",", ":")).encode()
        produce(p, topic, v, f"user-{rnd.randrange(20_000)}".encode(), 1_700_000_000_000 + i)
    p.flush()


def topology(inp, out, emit):
    b = StreamsBuilder()
    b.stream(inp).group_by(lambda k, v: v["page"]).count(emit=emit, name="page-views") \
        .to_stream().to(out)
    return b.build()


def run(bootstrap, inp, out, app, emit, guarantee, records, commit_interval_ms) -> float:
    kafka.create_topics(bootstrap, {out: 4})
    consumer_config = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    if guarantee == "exactly_once":
        consumer_config["isolation.level"] = "read_uncommitted"   # Tansu 0.6 (docs/semantics.md "Isolation level")
    with tempfile.TemporaryDirectory() as state:
        w = Worker(topology(inp, out, emit), bootstrap, app, state, processing_guarantee=guarantee,
                   commit_interval_ms=commit_interval_ms, consumer_config=consumer_config)
        t0 = time.monotonic()
        w.run(until_drained=True, install_signal_handlers=False)
        dt = w.last_record_at - w.first_record_at
        m = w.metrics()
    agg = next(v for k, v in m.items() if k.startswith("KTABLE-AGGREGATE"))
    print(f"{guarantee}: {w.records_processed:,} records processed (input + repartition) in {dt:.2f} s "
          f"(group join and startup {w.first_record_at - t0:.1f} s excluded)")
    print(f"  {emit!r}: {agg['records_in']:,} updates -> {agg['records_emitted']:,} emitted "
          f"({agg['noop_updates_skipped']:,} no-ops skipped, {agg['emissions_deferred']:,} deferred)")
    print(f"  count through a repartition topic, {guarantee}: {records / dt:,.0f} input records/s")
    return records / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--emit", choices=sorted(POLICIES), default="on_change")
    ap.add_argument("--guarantee", choices=["at_least_once", "exactly_once", "both"], default="at_least_once")
    ap.add_argument("--commit-interval-ms", type=int, default=1000)
    ap.add_argument("--bootstrap-servers")
    args = ap.parse_args()
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        inp, out = f"bench-clicks-{run_id}", f"bench-page-views-{run_id}"
        kafka.create_topics(bootstrap, {inp: 4})
        t0 = time.monotonic()
        load(bootstrap, inp, args.records)
        print(f"loaded {args.records:,} records into {inp} (4 partitions) in {time.monotonic() - t0:.1f} s")
        emit = POLICIES[args.emit]
        guarantees = ["at_least_once", "exactly_once"] if args.guarantee == "both" else [args.guarantee]
        rates = {}
        for guarantee in guarantees:
            rates[guarantee] = run(bootstrap, inp, f"{out}-{guarantee}", f"bench-{run_id}-{guarantee}", emit,
                                   guarantee, args.records, args.commit_interval_ms)
        if len(rates) == 2:
            print(f"exactly_once costs {rates['at_least_once'] / rates['exactly_once']:.2f}x at_least_once "
                  f"({rates['exactly_once']:,.0f} vs {rates['at_least_once']:,.0f} input records/s)")


if __name__ == "__main__":
    main()
