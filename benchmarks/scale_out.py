"""Benchmark: one worker process against two, on the same input (scaling out).

    python benchmarks/scale_out.py                 # local Tansu broker, 400,000 records, 4 partitions
    python benchmarks/scale_out.py --records 1000000 --workers 1,2,4 --bootstrap-servers host:9092

Loads N JSON orders into a 4-partition topic, then, for each worker count W, starts W worker
processes at once (one consumer group per W, so each run reads the whole topic) running a stream
filter with a per-record computation to an output topic, each until its partitions are drained.
The rate is N / (the last record processed by any worker - the first record processed by any),
the group join excluded; the records each worker processed are printed too. The broker runs on
the same machine: on 2 cores it competes with the workers for the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import add_child_arguments, broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor import StreamsBuilder  # noqa: E402
from processor.kafka import clients as kafka  # noqa: E402


def load(bootstrap, topic, n):
    rnd = random.Random(7)
    p = Producer(kafka.producer_defaults(bootstrap))
    for i in range(n):
        v = json.dumps({"order": i, "customer": f"c-{rnd.randrange(10_000)}", "amount": rnd.randrange(1000),
                        "items": [rnd.randrange(100) for _ in range(3)]}, separators=(",", ":")).encode()
        produce(p, topic, v, f"order-{i}".encode())
    p.flush()


def child(args) -> None:
    from processor.runtime.worker import Worker

    b = StreamsBuilder()
    (b.stream(args.topic)
     .filter(lambda k, v: v["amount"] > 300)
     .map_values(lambda v: {**v, "total": v["amount"] * sum(v["items"])})
     .to(args.out))
    w = Worker(b.build(), args.bootstrap_servers, args.app, args.state,
               consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    w.run(until_drained=True, install_signal_handlers=False)
    print(json.dumps({"processed": w.records_processed, "first": w.first_record_at, "last": w.last_record_at}))


def run(bootstrap, topic, workers: int, run_id: int) -> tuple[float, list[int]]:
    out, app = f"bench-scale-out-{run_id}-{workers}", f"bench-scale-{run_id}-{workers}"
    kafka.create_topics(bootstrap, {out: 4})
    with tempfile.TemporaryDirectory() as state:
        procs = [subprocess.Popen([sys.executable, __file__, "--child", "--bootstrap-servers", bootstrap,
                                   "--topic", topic, "--out", out, "--app", app, "--state", f"{state}/w{i}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(workers)]
        results = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=600)
            if p.returncode != 0:
                sys.exit(f"a worker failed ({p.returncode}):\n{stderr[-3000:]}")
            results.append(json.loads(stdout.strip().splitlines()[-1]))
    active = [r for r in results if r["first"] is not None]
    seconds = max(r["last"] for r in active) - min(r["first"] for r in active)
    return seconds, [r["processed"] for r in results]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    ap.add_argument("--bootstrap-servers")
    add_child_arguments(ap)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        topic = f"bench-scale-orders-{run_id}"
        kafka.create_topics(bootstrap, {topic: 4})
        t0 = time.monotonic()
        load(bootstrap, topic, args.records)
        print(f"loaded {args.records:,} records into {topic} (4 partitions) in {time.monotonic() - t0:.1f} s; "
              f"{os.cpu_count()} cores")
        rates = {}
        for n in [int(x) for x in args.workers.split(",")]:
            seconds, processed = run(bootstrap, topic, n, run_id)
            rates[n] = args.records / seconds
            print(f"{n} worker(s): {rates[n]:,.0f} records/s ({seconds:.2f} s; records per worker {processed})")
        base = min(rates)
        for n, r in sorted(rates.items()):
            if n != base:
                print(f"{n} workers vs {base}: {r / rates[base]:.2f}x")


if __name__ == "__main__":
    main()
