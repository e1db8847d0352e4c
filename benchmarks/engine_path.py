"""Benchmark: the worker's per-record path without Kafka I/O (issue 37's yardstick).

    python benchmarks/engine_path.py                          # every case, 100,000 records, 3 runs
    python benchmarks/engine_path.py --cases table_filter --records 200000 --repeat 5
    python benchmarks/engine_path.py --profile table_filter   # cProfile, top frames by self time

What a worker runs per record, minus the consumer: a ``Task`` (processor/engine/task.py) over a
real ``RocksDBDatabase`` in a temp dir wrapped in ``ChangeLoggingStores`` (what
``restore_target`` hands the worker), sending through a ``KafkaCollector`` whose producers are
real confluent-kafka producers pointed at a closed port (``produce`` queues in librdkafka; the
queue is purged at each commit, nothing leaves the process). Every ``--commit-every`` records a
commit unit runs as the worker's does (``prepare_commit``, ``ChangelogWriter.write_pending``,
``finish_commit``), minus the flushes and the commit record.

The records are peerbench's (``../shared/peerbench/bench/load.py``): JSON orders
``{"order_id", "customer_id", "amount", "status"}``, key ``str(order_id)`` (table filter, stream
filter) or ``str(customer_id)`` (count: 10,000 customers, ``orders_by_customer``), and the
topologies are peerbench's ``processor_apps`` (filter_table, filter_stream, count_direct).
``raw`` is the broker-free counterpart of peerbench's raw confluent-kafka loop (a bytes test
and ``produce`` per record, no state, no deserialization): the ceiling of the ratios.

Prints records/s per case (median of ``--repeat`` runs, each over a fresh database) and the
build that ran (``processor._compiled.build_info()`` where it exists). The seconds are the main
thread's CPU time (``--wall``: wall time): on a machine shared with other work that is the
figure that stays put; for A/B, interleave the builds (``--json`` prints one line per run).
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

# (appended: a PYTHONPATH or an installed build comes first, so one script measures any build)
sys.path.append(str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402

import processor  # noqa: E402
from processor import StreamsBuilder  # noqa: E402
from processor.engine.task import Task  # noqa: E402
from processor.runtime.changelog import ChangelogWriter  # noqa: E402
from processor.runtime.changelog_reader import restore_target  # noqa: E402
from processor.runtime.collector import KafkaCollector  # noqa: E402
from processor.serde import Serdes  # noqa: E402
from processor.state.rocksdb import RocksDBDatabase  # noqa: E402

IN, OUT = "orders", "out"
N_CUSTOMERS = 10_000
STATUSES = ["created", "paid", "shipped", "cancelled"]
# the main thread's CPU time (default: the machine is shared, wall time moves with the load of
# others; librdkafka's own threads are the I/O side and not counted), or wall time (--wall)
CLOCK = time.thread_time
# librdkafka queues everything in memory: no broker listens on this port
PRODUCER = {"bootstrap.servers": "127.0.0.1:9", "linger.ms": 5, "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000, "log_level": 0, "message.timeout.ms": 600_000}


def _source(b):
    return b.stream(IN, key_serde=Serdes.string(), value_serde=Serdes.json())


def filter_table():
    b = StreamsBuilder()
    b.table(IN, key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .filter(lambda k, v: v["amount"] > 500).to_stream().to(OUT)
    return b.build()


def filter_stream():
    b = StreamsBuilder()
    _source(b).filter(lambda k, v: v["amount"] > 500).to(OUT)
    return b.build()


def count_direct():
    b = StreamsBuilder()
    _source(b).group_by_key().aggregate(
        lambda: None,
        lambda k, v, a: {"customer_id": v["customer_id"], "count": (a["count"] if a else 0) + 1,
                         "sum": (a["sum"] if a else 0) + v["amount"]},
        name="count-sum", value_serde=Serdes.json()) \
        .to_stream().to(OUT, key_serde=Serdes.string(), value_serde=Serdes.json())
    return b.build()


CASES = {"table_filter": (filter_table, "order"), "stream_filter": (filter_stream, "order"),
         "count": (count_direct, "customer")}


def records(n: int, key_by: str) -> list[tuple]:
    rng = random.Random(42)
    out = []
    for i in range(n):
        o = {"order_id": i, "customer_id": i % N_CUSTOMERS, "amount": round(rng.uniform(0, 1000), 2),
             "status": STATUSES[rng.randrange(4)]}
        key = str(o["order_id"] if key_by == "order" else o["customer_id"]).encode()
        out.append((i, 1_700_000_000_000 + i, key, json.dumps(o).encode()))
    return out


def bench_collector() -> KafkaCollector:
    """The worker's collector over producers that never connect (``PRODUCER``), without delivery
    callbacks (the purge would report every record as failed). (Not a subclass: a class
    compiled by mypyc cannot be subclassed from Python.)"""
    c = KafkaCollector(dict(PRODUCER))
    c.producer = Producer({**PRODUCER, "delivery.report.only.error": True})
    c.changelog_producer = Producer(dict(PRODUCER))
    return c


def purge(collector: KafkaCollector) -> None:
    for p in (collector.producer, collector.changelog_producer):
        p.purge(True, True, False)
        p.poll(0)


def run_task(case: str, recs: list[tuple], commit_every: int) -> float:
    """Records/s of one task (partition 0) over ``recs``, a fresh database, commits included."""
    build, _ = CASES[case]
    topology = build().for_application("bench")
    collector = bench_collector()
    with tempfile.TemporaryDirectory(prefix="engine-path-") as d:
        db = RocksDBDatabase(Path(d) / "task-0_0")
        target = restore_target(topology, db, 0, 0)
        task = Task(topology, 0, 0, target.stores, collector, lambda: int(time.time() * 1000),
                    on_error="dlq", dlq_topic="bench-dlq")
        writer = ChangelogWriter(task, target.changelogs, collector.send_changelog,
                                 collector.send_changelog_records)
        process = task.process
        t0 = CLOCK()
        since = 0
        for offset, ts, key, value in recs:
            process(IN, 0, offset, ts, key, value, None)
            since += 1
            if since == commit_every:
                _commit(task, writer, collector)
                since = 0
        _commit(task, writer, collector)
        dt = CLOCK() - t0
        task.close()
    return len(recs) / dt


def _commit(task, writer, collector) -> None:
    pos, outbox = task.prepare_commit()
    writer.write_pending()
    writer._awaiting = 0                 # (no delivery reports: nothing is delivered)
    task.finish_commit(pos, outbox, dict(writer.ends))
    purge(collector)


def run_raw(recs: list[tuple], commit_every: int) -> float:
    p = Producer(dict(PRODUCER))
    produce = p.produce
    t0 = CLOCK()
    since = 0
    for _offset, ts, key, value in recs:
        if b'"amount": 9' in value:      # (a bytes test standing for the filter, as peerbench's)
            produce(OUT, value, key, -1, None, None, ts, None)
        since += 1
        if since == commit_every:
            p.purge(True, True, False)
            since = 0
    dt = CLOCK() - t0
    p.purge(True, True, False)
    return len(recs) / dt


def build_name() -> str:
    compiled = getattr(processor, "_compiled", None)   # (issue 37: absent before it)
    return compiled.build_info() if compiled else "pure Python (no processor._compiled)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--commit-every", type=int, default=50_000)
    ap.add_argument("--cases", default="raw,table_filter,stream_filter,count")
    ap.add_argument("--profile", metavar="CASE", help="cProfile one run of CASE; print the top frames")
    ap.add_argument("--json", action="store_true", help="one JSON line: {case: median records/s}")
    ap.add_argument("--wall", action="store_true", help="wall time instead of the main thread's CPU time")
    ap.add_argument("--generate", type=int, default=0,
                    help="build this many records (at least --records) and run the first --records: two runs "
                         "of different lengths then differ only in records processed (per-record instruction "
                         "counts: docs/compiled.md)")
    args = ap.parse_args()
    if args.wall:
        global CLOCK
        CLOCK = time.perf_counter
    data = {kb: records(max(args.records, args.generate), kb)[:args.records] for kb in ("order", "customer")}
    if args.profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        run_task(args.profile, data[CASES[args.profile][1]], args.commit_every)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return
    results = {}
    for case in args.cases.split(","):
        rates = [run_raw(data["order"], args.commit_every) if case == "raw"
                 else run_task(case, data[CASES[case][1]], args.commit_every) for _ in range(args.repeat)]
        results[case] = statistics.median(rates)
        if not args.json:
            print(f"{case:14s} {results[case]:>10,.0f} records/s  (median of {args.repeat}: "
                  f"{', '.join(f'{r:,.0f}' for r in rates)})", flush=True)
    if args.json:
        print(json.dumps({"build": build_name(), **{k: round(v) for k, v in results.items()}}))
    else:
        print(f"build: {build_name()}")


if __name__ == "__main__":
    main()
