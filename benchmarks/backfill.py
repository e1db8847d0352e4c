"""Benchmark: the Spark backfill vs the live worker replaying the same history from scratch.

    python benchmarks/backfill.py                     # local Tansu broker, 1,000,000 order updates
    python benchmarks/backfill.py --records 100000    # a quick run
    python benchmarks/backfill.py --records 300000 --keys 20000 --customers 2000 --partitions 4 --master 'local[2]'

Loads one history into two ``--partitions``-partition topics (JSON values, keys placed by
murmur2 as ``processor.kafka.clients.producer_defaults`` does): C customers (``--customers``,
default 5,000), then N order updates (``--records``) over K order keys (``--keys``, default
50,000; 10 % of updates move the order to another customer, 2 % are deletes) with one customer
update (its region changes) per 100 order updates, timestamps rising in that global order. The
topology is a foreign-key join and an aggregate of its result::

    orders.join_on_foreign_key(customers, order -> customer, -> {amount, region})
          .group_by(region).aggregate({orders: count, amount: sum}) -> output topic

Then, on that same history, one after the other:

1. **Backfill**: ``backfill.run(topology, ..., spark=session)`` into a fresh state directory,
   with a Spark session started before the clock (the JVM and Spark's Python workers, by a
   trivial Python job: its start time is printed separately; the backfill's own imports stay
   inside the clock), stopped before the live run. Prints the wall time, input rows/s, the
   ``BackfillReport`` and seconds per stage.
2. **Live**: ``Worker(...).run(until_drained=True)`` (what ``processor run`` runs) from scratch
   into another state directory, until every input and internal partition is drained. Input
   rows/s from the first record processed to the last, as the other benchmarks measure (the
   group join excluded); the wall time including start-up is printed too.

Finally the ratio (live seconds / backfill seconds), and the two state directories compared:
every contract column family (name not starting with ``__``) of every ``task-*`` database,
keys and value bytes, the foreign-key join's result store and the aggregate's stores without
their timestamps (a result's timestamp depends on the order the two sides met; docs/backfill.md
"Same stores"), the application id in keys and values written ``<app>`` (internal topic names).
Differing keys are printed per store, loudly, but do not fail the benchmark; live-only
high-water marks of records whose source is an internal topic are counted apart (the backfill
does not keep them, by design: backfill/handoff.py).
Targets on a 2-core machine (issue 13): backfill >= 5x faster than the live replay and
>= 200k input rows/s excluding Spark's session start.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backfill_topology import AGG_STORE, ENV, JOIN_STORE, topology  # noqa: E402,F401
from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from processor.kafka import clients as kafka  # noqa: E402
from processor.runtime.worker import Worker  # noqa: E402

T0 = 1_700_000_000_000
REGIONS = 20
CUSTOMER_UPDATE_EVERY = 100      # one customer update per this many order updates
BENCH_DIR = Path(__file__).resolve().parent


# -- the history ------------------------------------------------------------------------------------
def load(bootstrap, orders, customers, n, keys, c, seed=42) -> dict[str, int]:
    """Produce the history (see the module docstring); returns records per topic."""
    rnd = random.Random(seed)
    conf = kafka.producer_defaults(bootstrap)
    conf.update({"linger.ms": 50, "queue.buffering.max.kbytes": 1 << 20})   # big batches
    p = Producer(conf)
    ts = T0
    sent = {orders: 0, customers: 0}

    def send(topic, key, value):
        nonlocal ts
        produce(p, topic, value, key, ts)
        ts += 1
        sent[topic] += 1

    for i in range(c):
        send(customers, f"cust-{i}".encode(),
             f'{{"name":"customer {i}","region":"r{rnd.randrange(REGIONS)}","tier":{i % 3}}}'.encode())
    owner: dict[int, int] = {}
    randrange, random_ = rnd.randrange, rnd.random
    for i in range(n):
        if i % CUSTOMER_UPDATE_EVERY == CUSTOMER_UPDATE_EVERY - 1:
            cu = randrange(c)
            send(customers, f"cust-{cu}".encode(),
                 f'{{"name":"customer {cu}","region":"r{randrange(REGIONS)}","tier":{cu % 3}}}'.encode())
        k = randrange(keys)
        cust = owner.get(k)
        if cust is not None and random_() < 0.02:
            del owner[k]
            send(orders, f"order-{k}".encode(), None)
            continue
        if cust is None or random_() < 0.1:
            cust = owner[k] = randrange(c)
        send(orders, f"order-{k}".encode(),
             f'{{"customer":"cust-{cust}","amount":{randrange(10_000)},"seq":{i}}}'.encode())
        if i % 20_000 == 0:
            p.poll(0)
    if p.flush(120):
        raise SystemExit("benchmark: the history was not delivered within 120 s")
    return sent


# -- comparing the two state directories ------------------------------------------------------------
APP = b"<app>-"


def read_stores(state_dir: Path, application_id: str) -> dict[str, dict[tuple[str, bytes], bytes]]:
    """Every contract column family of every task database: store -> {(task, key): value}, with
    the application id in keys and values (internal topic names in high-water marks) written
    ``<app>``, so that two applications' stores compare."""
    from processor.state.rocksdb import RocksDBDatabase

    own = application_id.encode() + b"-"
    out: dict[str, dict] = {}
    for task_dir in sorted((state_dir / application_id).glob("task-*")):
        db = RocksDBDatabase(task_dir)
        try:
            for cf in db.column_families():
                if cf.startswith("__") or cf == "default":
                    continue
                entries = out.setdefault(cf, {})
                for k, v in db.store(cf).items():
                    entries[(task_dir.name, bytes(k).replace(own, APP))] = bytes(v).replace(own, APP)
        finally:
            db.close()
    return out


def timestamp_free(topo) -> dict[str, callable]:
    """Stores whose values are compared without their timestamps: the foreign-key join's result
    and the aggregate downstream of it (timestamped layout: 8 leading bytes), and the aggregate's
    last-emitted column (``{version}{flags}{8-byte ts}{8-byte emitted-at}{value}``)."""
    from processor.state import emitted, timestamped

    masks = {}
    for name, spec in topo.stores.items():
        if spec.kind == "emitted":
            masks[name] = lambda v: v[:2] + v[emitted.HEADER_SIZE:]
        elif name == JOIN_STORE or spec.kind == "aggregate":
            masks[name] = lambda v: v[timestamped.TIMESTAMP_SIZE:]
    return masks


FK_FED_TASKS: set[str] = set()   # task-<sub>_ prefixes of sub-topologies fed by a foreign-key join's results


def fk_fed_tasks(topo) -> set[str]:
    """``task-<sub>_`` of each sub-topology that reads an internal topic written by a
    sub-topology holding a foreign-key join's result (docs/backfill.md "Same stores": what is fed by those
    results inherits their interleaving-dependent timestamps and causes)."""
    writers = topo.internal_topics()
    fk_subs = {i for i, sub in enumerate(topo.subtopologies) if any(n.name.startswith("KTABLE-FK-JOIN-OUTPUT")
                                                                  for n in sub)}
    out = set()
    for i in range(len(topo.subtopologies)):
        if any(w in fk_subs for t in topo.source_topics(i) for w in writers.get(t, ())):
            out.add(f"task-{i}_")
    return out


def documented(store: str, key: bytes, task: str = "") -> bool:
    """An entry the backfill's may differ in by design (docs/backfill.md "Same stores"): the high-water mark
    of records whose source is an internal topic (those records were rows of a shuffle in the
    backfill, never in Kafka, so no replay of them can come), and the bookkeeping (stream time,
    high-water marks) of a sub-topology fed by a foreign-key join's results."""
    if store == "_bookkeeping" and any(task.startswith(p) for p in FK_FED_TASKS):
        return True
    if not key.startswith(b"hwm\x00"):
        return False
    parts = key.split(b"\x00")
    return len(parts) == 4 and parts[2].startswith(APP)


def compare(backfilled: dict, live: dict, masks: dict) -> tuple[int, int]:
    """Print, per store, entries and differing keys; returns (differing keys, of which the
    documented difference)."""
    total = expected = 0
    print("stores, backfill vs live (contract column families, all tasks):")
    for store in sorted(set(backfilled) | set(live)):
        a, b = backfilled.get(store, {}), live.get(store, {})
        mask = masks.get(store) or bytes
        only_a = a.keys() - b.keys()
        only_b = b.keys() - a.keys()
        common = a.keys() & b.keys()
        differ = sorted(k for k in common if mask(a[k]) != mask(b[k]))
        ts_only = sum(1 for k in common if a[k] != b[k]) - len(differ)
        doc = sum(1 for k in list(only_b) + list(only_a) + differ if documented(store, k[1], k[0]))
        bad = len(only_a) + len(only_b) + len(differ)
        total += bad
        expected += doc
        note = f" (compared without timestamps; {ts_only:,} differ in timestamps only)" if store in masks else ""
        status = "0 differing keys" if bad == 0 else (
            f"!!! {bad:,} DIFFERING KEYS: {len(only_a):,} only in backfill, {len(only_b):,} only in live, "
            f"{len(differ):,} with other values")
        if doc:
            status += (f"; {doc:,} of them documented differences (high-water marks of records whose "
                       f"source is an internal topic; bookkeeping of what a foreign-key join's results feed)")
        print(f"  {store}: {len(a):,} / {len(b):,} entries, {status}{note}")
        if bad > doc:
            for k in sorted(only_a)[:3]:
                print(f"      only in backfill: {k[0]} {k[1]!r} = {a[k]!r}")
            for k in sorted(k for k in only_b if not documented(store, k[1], k[0]))[:3]:
                print(f"      only in live:     {k[0]} {k[1]!r} = {b[k]!r}")
            for k in differ[:3]:
                print(f"      differs: {k[0]} {k[1]!r}: backfill {a[k]!r} / live {b[k]!r}")
    return total, expected


# -- the two runs -----------------------------------------------------------------------------------
def spark_session(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(master).appName("benchmark-backfill")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def run_backfill(topo, bootstrap, app, state, master, rows) -> float:
    import backfill

    t0 = time.monotonic()
    session = spark_session(master)
    session.range(1).count()          # the JVM up
    t1 = time.monotonic()
    # Spark's Python worker daemon and its workers up too, as on a session that has run any Python
    # job before: a trivial lambda, nothing of this project imported (the backfill's own imports
    # in the executors stay inside the clock). A first Python job on a fresh session pays this.
    n = session.sparkContext.defaultParallelism
    session.sparkContext.parallelize(range(n), n).map(lambda x: x).count()
    t2 = time.monotonic()
    print(f"spark session ({master}) started in {t2 - t0:.1f} s (not timed; of which {t2 - t1:.1f} s "
          f"starting {n} Python workers)")
    try:
        t0 = time.monotonic()
        report = backfill.run(topo, bootstrap_servers=bootstrap, application_id=app, state_dir=state, spark=session)
        wall = time.monotonic() - t0
    finally:
        session.stop()
    for line in report.lines():
        print(line)
    print(f"backfill: {report.rows_read:,} input rows in {wall:.2f} s wall (session start excluded): "
          f"{report.rows_read / wall:,.0f} input rows/s")
    print("  seconds per stage: " + ", ".join(f"{k} {v:.2f}" for k, v in report.seconds.items())
          + f", other {wall - sum(report.seconds.values()):.2f}")
    if report.rows_read != rows:
        print(f"!!! backfill read {report.rows_read:,} rows, the history has {rows:,}")
    return wall


def run_command(topics, bootstrap, app, state, master, rows, code_root, emit_outputs=False) -> float:
    """The whole ``processor backfill`` command, as a user waits for it (Python's and Spark's
    start included), of the code at ``code_root`` (default: this checkout), on ``master``.
    Returns the wall time."""
    import subprocess

    env = dict(os.environ)
    env.update(dict(zip(ENV, topics, strict=False)))
    env["PYTHONPATH"] = os.pathsep.join([str(code_root), str(BENCH_DIR)])
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    argv = [sys.executable, "-m", "processor.cli", "backfill", "backfill_topology:topology_from_env",
            "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(state),
            "--master", master, "--conf", "spark.ui.showConsoleProgress=false"]
    if emit_outputs:
        argv.append("--emit-outputs")
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=str(code_root), env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        if "--conf" in res.stderr:   # code from before --conf (argparse: ambiguous or unknown)
            res = subprocess.run([a for a in argv if a not in ("--conf", "spark.ui.showConsoleProgress=false")],
                                 cwd=str(code_root), env=env, capture_output=True, text=True)
            wall = time.monotonic() - t0
        if res.returncode != 0:
            raise SystemExit(f"processor backfill failed ({res.returncode}):\n{res.stderr[-3000:]}")
    stages = next((line.strip() for line in res.stdout.splitlines() if line.strip().startswith("seconds:")), "")
    if logging.getLogger().isEnabledFor(logging.INFO):
        for line in res.stderr.splitlines():
            if "processor.backfill" in line:
                print("    " + line)
    label = "this checkout" if Path(code_root).resolve() == BENCH_DIR.parent else str(code_root)
    print(f"processor backfill --master {master}{' --emit-outputs' if emit_outputs else ''} ({label}): "
          f"{rows:,} input rows in {wall:.1f} s as a user waits (Spark's start included): "
          f"{rows / wall:,.0f} input rows/s; {stages}")
    return wall


def compare_outputs(bootstrap, live_topic, backfill_topic) -> None:
    """The live replay's output topic against the last ``--emit-outputs`` run's: the backfill
    writes each key's last record (the final table), so compare the last record per key
    (value bytes and timestamp) and print the result."""
    def last(topic):
        out = {}
        for m in kafka.read_topic(bootstrap, topic):
            out[m.key()] = (m.value(), m.timestamp()[1])
        return out

    live, bf = last(live_topic), last(backfill_topic)
    live = {k: v for k, v in live.items() if v[0] is not None}
    differ = sorted(k for k in set(live) | set(bf) if (live.get(k) or (None,))[0] != (bf.get(k) or (None,))[0])
    stamps = sum(1 for k in set(live) & set(bf) if live[k][0] == bf[k][0] and live[k][1] != bf[k][1])
    if differ:
        print(f"!!! THE OUTPUTS DIFFER: {len(differ):,} of {len(live):,} keys (first {differ[:3]})")
    else:
        print(f"the outputs agree: {backfill_topic} holds the live output's last record per key, same keys and "
              f"value bytes ({len(bf):,} keys; {stamps} differ in timestamps only, as the aggregate's store "
              f"below: the order of records of different partitions is the documented difference)")


def run_live(topo, bootstrap, app, state, rows) -> tuple[float, float]:
    w = Worker(topo, bootstrap, app, state,
               consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    t0 = time.monotonic()
    w.run(until_drained=True, install_signal_handlers=False)
    wall = time.monotonic() - t0
    dt = w.last_record_at - w.first_record_at
    print(f"live worker: {w.records_processed:,} records processed (input + internal) in {dt:.2f} s from the "
          f"first record to the last (group join and startup {w.first_record_at - t0:.1f} s excluded; "
          f"{wall:.1f} s wall in all)")
    print(f"live worker: {rows / dt:,.0f} input rows/s")
    return dt, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="order updates (default 1,000,000)")
    ap.add_argument("--keys", type=int, default=50_000, help="order keys (default 50,000)")
    ap.add_argument("--customers", type=int, default=5_000, help="customer keys (default 5,000)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--master", default="local[*]", help="Spark master of the backfill (default local[*])")
    ap.add_argument("--bootstrap-servers", help="an existing broker (default: start a local Tansu)")
    ap.add_argument("--no-live", action="store_true", help="backfill only (e.g. to profile it)")
    ap.add_argument("--masters", default=None, metavar="M1,M2,...",
                    help="run the whole `processor backfill` command (Spark's start included) once per master "
                         "instead of backfill.run in this process; 'cluster' starts a Spark standalone "
                         "cluster of one worker with 2 cores whose executors see none of this machine's "
                         "temporary directories (e.g. local[1],local[2],cluster)")
    ap.add_argument("--code-root", action="append", default=[], metavar="DIR",
                    help="with --masters: the checkout whose code runs the command (repeatable: an A/B of "
                         "two versions, alternated; default this checkout)")
    ap.add_argument("--repeat", type=int, default=1, help="with --masters: runs of each (master, code root)")
    ap.add_argument("--emit-outputs", action="store_true", help="the backfill also writes the outputs")
    ap.add_argument("--verbose", action="store_true", help="the backfill's and the worker's log (INFO)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    suffix = f"-{int(time.time())}" if args.bootstrap_servers else ""
    with broker(args.bootstrap_servers) as bootstrap:
        run_id = int(time.time())
        orders, customers, out = (f"bench-orders-{run_id}", f"bench-customers-{run_id}",
                                  f"bench-revenue-{run_id}")
        kafka.create_topics(bootstrap, {orders: args.partitions, customers: args.partitions, out: args.partitions})
        t0 = time.monotonic()
        sent = load(bootstrap, orders, customers, args.records, args.keys, args.customers)
        rows = sum(sent.values())
        print(f"loaded {sent[orders]:,} order updates ({args.keys:,} keys) and {sent[customers]:,} customer "
              f"records ({args.customers:,} keys), {args.partitions} partitions each, in "
              f"{time.monotonic() - t0:.1f} s: {rows:,} input rows")
        topo = topology(orders, customers, out)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} before the runs"
              f"{' (other processes compete: expect slower figures)' if os.getloadavg()[0] > 0.5 else ''}")
        with tempfile.TemporaryDirectory(prefix="bench-backfill-") as bstate, \
                tempfile.TemporaryDirectory(prefix="bench-live-") as lstate:
            b_app, l_app = f"bench-backfill{suffix}", f"bench-live{suffix}"
            print()
            walls: dict = {}
            if args.masters:
                masters = args.masters.split(",")
                roots = args.code_root or [str(BENCH_DIR.parent)]
                cluster = None
                if "cluster" in masters:
                    from tests.support.spark_cluster import StandaloneCluster

                    cluster = StandaloneCluster([tempfile.gettempdir(), str(BENCH_DIR)],
                                                Path(tempfile.mkdtemp(prefix="bench-spark-cluster-"))).start()
                    print(f"standalone cluster {cluster.master_url}: 1 worker, 2 cores, in a private mount "
                          f"namespace ({tempfile.gettempdir()} and {BENCH_DIR} hidden from its executors)")
                try:
                    n = 0
                    for rep in range(args.repeat):
                        for master in masters:
                            for root in roots:
                                state = Path(bstate) / f"run-{n}"
                                app = b_app if (rep, master, root) == (args.repeat - 1, masters[-1], roots[0]) \
                                    else f"{b_app}-{n}"
                                m = cluster.master_url if master == "cluster" else master
                                # --emit-outputs: each run writes an output topic of its own, empty
                                # before it (a sink topic holding records is not compacted)
                                run_out = f"{out}-bf{n}" if args.emit_outputs else out
                                if args.emit_outputs:
                                    kafka.create_topics(bootstrap, {run_out: args.partitions})
                                walls.setdefault((master, root), []).append(
                                    run_command((orders, customers, run_out), bootstrap, app, state, m, rows,
                                                root, args.emit_outputs))
                                n += 1
                                if app == b_app:
                                    bstate_final, out_final = state, run_out
                finally:
                    if cluster is not None:
                        cluster.stop()
                b_wall = min(min(v) for v in walls.values())
            else:
                b_wall = run_backfill(topo, bootstrap, b_app, bstate, args.master, rows)
                bstate_final = Path(bstate)
            if args.no_live:
                return
            print()
            l_dt, l_wall = run_live(topo, bootstrap, l_app, lstate, rows)
            print()
            for (master, root), ws in walls.items():
                label = "" if len(args.code_root) < 2 else f" ({root})"
                print(f"processor backfill --master {master}{label}: {', '.join(f'{w:.1f}' for w in ws)} s; "
                      f"best {min(ws):.1f} s = {rows / min(ws):,.0f} input rows/s; the live replay took "
                      f"{l_wall:.1f} s as a user waits ({l_wall / min(ws):.2f}x), {l_dt:.1f} s from its first "
                      f"record ({l_dt / min(ws):.2f}x)")
            ratio = l_dt / b_wall
            print(f"machine: load average {os.getloadavg()[0]:.1f} after the runs")
            print(f"speed-up of the backfill over the live replay: {ratio:.2f}x ({b_wall:.1f} s vs {l_dt:.1f} s; "
                  f"{rows / b_wall:,.0f} vs {rows / l_dt:,.0f} input rows/s)"
                  f"{'' if ratio >= 5 else '   [target: >= 5x]'}")
            if rows / b_wall < 200_000:
                print(f"  [target: backfill >= 200,000 input rows/s excluding the session start; "
                      f"measured {rows / b_wall:,.0f}]")
            if args.emit_outputs and args.masters:
                compare_outputs(bootstrap, out, out_final)
            print()
            masks = timestamp_free(topo.for_application(b_app))
            FK_FED_TASKS.update(fk_fed_tasks(topo.for_application(b_app)))
            bad, doc = compare(read_stores(bstate_final, b_app), read_stores(Path(lstate), l_app), masks)
            if bad > doc:
                print(f"!!! THE STORES DIFFER: {bad - doc:,} differing key(s) beyond the documented difference "
                      f"({bad:,} in all, see above)")
            else:
                print("the stores agree: every contract column family, same keys and value bytes (timestamps "
                      "aside where noted" + (f"; {doc:,} documented difference(s)" if doc else "")
                      + ")")


if __name__ == "__main__":
    main()
