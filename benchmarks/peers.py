"""The peer benchmark: this project beside Kafka Streams itself, Quix Streams, Faust and a raw
confluent-kafka loop, the same workloads on the same broker in one sitting, each engine's output
verified.

    .venv/bin/python benchmarks/peers.py                      # Apache Kafka 4.4 started for the run
    .venv/bin/python benchmarks/peers.py --records 50000 --reps 1 --workloads count,fk_join
    .venv/bin/python benchmarks/peers.py --bootstrap-servers host:9092

Workloads (``peer_topologies.py`` here, ``tests/reference/java/BenchTopologies.java`` for Kafka
Streams; JSON values, 4 partitions, 10,000 customers, inputs produced with Java's murmur2):

| workload | what each input record does |
|---|---|
| ``stream_filter`` | ``orders`` filtered on ``amount > 500`` |
| ``table_filter`` | ``customer_updates`` as a table, filtered on ``amount > 500`` |
| ``count`` | ``orders_by_customer`` (keyed by customer) counted per key |
| ``count_repartition`` | ``orders`` regrouped by customer (a repartition topic), counted |
| ``stream_table_join`` | ``orders_by_customer`` joined with the ``customers`` table |
| ``fk_join`` | ``orders`` as a table joined by foreign key with ``customers`` (KIP-213) |

Engines: ``processor`` (``processor run``, this checkout), ``kafka-streams`` (Kafka Streams 4.4
with its record cache, 10 MB), ``kafka-streams-nocache`` (``statestore.cache.max.bytes=0``:
every update forwarded, as this project forwards record by record), ``quixstreams`` (Quix
Streams 3.28, ``peer_engines/quixstreams_app.py``: no foreign-key join), ``faust``
(faust-streaming 0.15, ``peer_engines/faust_app.py``: no joins), ``confluent-kafka`` (a
hand-written consume-filter-produce loop, ``stream_filter`` only). Quix Streams and Faust run in
virtual environments of their own, made once from ``peer_engines/requirements-*.txt`` under
``~/.cache/processor/peer-venvs``. All at least once, a commit interval of 100 ms, producer
``linger.ms=5``, a fresh group, output topic and state directory per run.

Measured: records/s = input records / (last output's broker append time - first output's), the
output topic's ``message.timestamp.type=LogAppendTime``, so start-up and group join are not
counted, and no engine's own clock is trusted. Verified per run: the stream filter's distinct
outputs, the table filter's final table, every customer's final count, every order joined.
Results are printed as a table (medians of ``--reps``) and appended to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import broker, produce  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import NewTopic  # noqa: E402

from processor.kafka import clients as kafka  # noqa: E402
from tests.integration.helpers import wait_until_group_drained  # noqa: E402
from tests.reference import kafka_streams  # noqa: E402

PARTITIONS = 4
CUSTOMERS = 10_000
WORKLOADS = ["stream_filter", "table_filter", "count", "count_repartition", "stream_table_join", "fk_join"]
ENGINES = ["processor", "kafka-streams", "kafka-streams-nocache", "quixstreams", "faust", "confluent-kafka"]
# the workloads an engine offers, if not all (the table shows "n/a" for the others)
OFFERS = {"quixstreams": ["stream_filter", "table_filter", "count", "count_repartition", "stream_table_join"],
          "faust": ["stream_filter", "table_filter", "count", "count_repartition"],
          "confluent-kafka": ["stream_filter"]}
PEER_ENGINES = Path(__file__).resolve().parent / "peer_engines"
INPUTS = {"stream_filter": ["orders"], "table_filter": ["customer_updates"], "count": ["orders_by_customer"],
          "count_repartition": ["orders"], "stream_table_join": ["orders_by_customer", "customers"],
          "fk_join": ["orders", "customers"]}


def dumps(v: dict) -> bytes:
    return json.dumps(v, sort_keys=True, separators=(",", ":")).encode()


def load(bootstrap: str, prefix: str, n: int) -> dict:
    """Produces the inputs (untimed) and returns what a correct run outputs."""
    rnd = random.Random(42)
    topics = ["orders", "orders_by_customer", "customer_updates", "customers"]
    kafka.create_topics(bootstrap, {prefix + t: PARTITIONS for t in topics})
    p = Producer({**kafka.producer_defaults(bootstrap), "partitioner": "murmur2_random", "linger.ms": 20})
    base = int(time.time() * 1000) - 3_600_000
    counts: dict[str, int] = {}
    final_updates: dict[str, dict] = {}
    passing_ids: set[str] = set()
    for c in range(CUSTOMERS):
        produce(p, prefix + "customers", dumps({"customer_id": c, "name": f"c{c}"}), str(c).encode(), base)
    p.flush()
    for i in range(n):
        c = i % CUSTOMERS
        order = {"order_id": i, "customer_id": c, "amount": round(rnd.uniform(0, 1000), 2)}
        produce(p, prefix + "orders", dumps(order), str(i).encode(), base + 1 + i)
        produce(p, prefix + "orders_by_customer", dumps(order), str(c).encode(), base + 1 + i)
        update = {"customer_id": rnd.randrange(CUSTOMERS), "amount": round(rnd.uniform(0, 1000), 2)}
        produce(p, prefix + "customer_updates", dumps(update), str(update["customer_id"]).encode(), base + 1 + i)
        final_updates[str(update["customer_id"])] = update
        counts[str(c)] = counts.get(str(c), 0) + 1
        if order["amount"] > 500:
            passing_ids.add(str(i))
        if i % 50_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return {"n": n, "counts": counts, "passing_ids": passing_ids, "passing": len(passing_ids),
            "table": {k: v for k, v in final_updates.items() if v["amount"] > 500}}


def verify(workload: str, records: list, expected: dict) -> str:
    """'' if the output is right, else what is wrong."""
    if workload == "stream_filter":
        keys = {k.decode() for k, _v, _ts in records}
        if keys == expected["passing_ids"]:
            return ""
        return f"{len(keys)} distinct outputs, {expected['passing']} expected"
    last: dict[str, bytes | None] = {}
    for k, v, _ts in records:
        last[k.decode()] = v
    if workload == "table_filter":
        got = {k: json.loads(v) for k, v in last.items() if v is not None}
        return "" if got == expected["table"] else f"final table: {len(got)} rows, {len(expected['table'])} expected"
    if workload in ("count", "count_repartition"):
        got = {k: int.from_bytes(v, "big") for k, v in last.items() if v is not None}
        wrong = sum(got.get(k) != c for k, c in expected["counts"].items())
        return "" if got == expected["counts"] else f"counts of {wrong} customers wrong"
    if workload == "stream_table_join":
        ids = {json.loads(v)["order"]["order_id"] for _k, v, _ts in records if v is not None}
        return "" if len(ids) == expected["n"] else f"{len(ids)} orders joined of {expected['n']}"
    if workload == "fk_join":
        got = {k for k, v in last.items() if v is not None}
        return "" if len(got) == expected["n"] else f"{len(got)} orders joined of {expected['n']}"
    raise ValueError(workload)


def read_output(bootstrap: str, topic: str) -> list:
    return [(m.key(), m.value(), m.timestamp()[1])
            for m in kafka.read_topic(bootstrap, topic, isolation_level="read_uncommitted")]


def internal_topics(bootstrap: str, app: str) -> dict[str, int]:
    """The repartition and foreign-key topics of ``app``: ``<app>-...-repartition`` or ``-topic``
    (this project, Kafka Streams), ``repartition__<app>--...`` (Quix Streams),
    ``<agent>-<topic>-<name>-repartition`` (Faust: its ``group_by`` names carry ``app`` here)."""
    md = kafka.admin(bootstrap).list_topics(timeout=10)
    return {t: len(m.partitions) for t, m in md.topics.items()
            if app in t and (t.endswith("-repartition") or t.endswith("-topic") or t.startswith("repartition__"))}


def raw_filter_loop(bootstrap: str, group: str, topic: str, out: str) -> None:
    """The confluent-kafka loop: consume, decode, filter, produce; commit after each flushed batch."""
    c = Consumer({**kafka.consumer_defaults(bootstrap), "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "enable.auto.offset.store": True, "fetch.queue.backoff.ms": 10})
    p = Producer({**kafka.producer_defaults(bootstrap), "linger.ms": 5})
    c.subscribe([topic])
    last_commit, consumed = time.monotonic(), False
    while True:
        for m in c.consume(1000, 0.5):
            if m.error():
                continue
            consumed = True
            if json.loads(m.value())["amount"] > 500:
                produce(p, out, m.value(), m.key())
        if consumed and time.monotonic() - last_commit > 0.1:
            p.flush()
            c.commit(asynchronous=False)
            last_commit, consumed = time.monotonic(), False


def peer_python(engine: str) -> str:
    """The Python of ``engine``'s own virtual environment (Quix Streams, Faust), made once from
    ``peer_engines/requirements-<engine>.txt`` (its hash names the folder)."""
    import hashlib

    from processor.runtime.apache_kafka import built_once

    requirements = PEER_ENGINES / f"requirements-{engine}.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    target = Path.home() / ".cache" / "processor" / "peer-venvs" / f"{engine}-{digest}"

    def build(staging: Path) -> None:
        print(f"making the {engine} environment from {requirements.name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
        subprocess.run([str(staging / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(requirements)],
                       check=True)
    return str(built_once(target, build, requirements.read_text()) / "bin" / "python")


def start_engine(engine: str, workload: str, bootstrap: str, prefix: str, out: str, app: str, state: Path, log: Path):
    params = {"prefix": prefix, "out": out}
    with open(log, "w") as logf:   # the child keeps its own copy of the descriptor
        return _spawn(engine, workload, bootstrap, prefix, out, app, state, params, logf)


def _spawn(engine: str, workload: str, bootstrap: str, prefix: str, out: str, app: str, state: Path, params: dict,
           logf):
    if engine == "processor":
        env = dict(os.environ, PEER_WORKLOAD=workload, PEER_PARAMS=json.dumps(params),
                   PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        return subprocess.Popen([sys.executable, "-m", "processor.cli", "run", "benchmarks.peer_topologies:topology",
                                 "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(state),
                                 "--commit-interval-ms", "100"], cwd=ROOT, env=env, stdout=logf, stderr=logf)
    if engine.startswith("kafka-streams"):
        extra = ["commit.interval.ms=100"] + (["statestore.cache.max.bytes=0"] if engine.endswith("nocache") else [])
        return subprocess.Popen(kafka_streams.java_command("StreamsApp", f"bench:{workload}", json.dumps(params),
                                                           bootstrap, app, str(state), *extra, jvm_options=()),
                                stdin=subprocess.PIPE, stdout=logf, stderr=logf)
    if engine in ("quixstreams", "faust"):
        return subprocess.Popen([peer_python(engine), str(PEER_ENGINES / f"{engine}_app.py"), workload, bootstrap,
                                 prefix, out, app, str(state)], cwd=state.parent, stdout=logf, stderr=logf)
    if engine == "confluent-kafka":
        return subprocess.Popen([sys.executable, __file__, "--child-raw", bootstrap, app, prefix + "orders", out],
                                stdout=logf, stderr=logf)
    raise ValueError(engine)


def stop_engine(proc) -> None:
    if proc.stdin:
        proc.stdin.close()
    else:
        proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_one(bootstrap: str, prefix: str, workload: str, engine: str, expected: dict, tmp: Path) -> dict:
    tag = uuid.uuid4().hex[:6]
    out, app = f"{prefix}out-{workload}-{engine}-{tag}", f"peers-{engine}-{workload}-{tag}"
    admin = kafka.admin(bootstrap)   # (held until the result is in)
    topic = NewTopic(out, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([topic])[out].result(30)
    inputs = {prefix + t: PARTITIONS for t in INPUTS[workload]}
    log = tmp / f"{app}.log"
    proc = start_engine(engine, workload, bootstrap, prefix, out, app, tmp / app, log)
    t0 = time.monotonic()

    def alive():
        if proc.poll() is not None:
            raise RuntimeError(f"{engine} exited {proc.returncode}: {log.read_text()[-2000:]}")
    try:
        wait_until_group_drained(bootstrap, app, inputs, timeout_s=900, check=alive)
        wait_until_group_drained(bootstrap, app, {**inputs, **internal_topics(bootstrap, app)}, timeout_s=900,
                                 check=alive)
        wall = time.monotonic() - t0
    finally:
        stop_engine(proc)
    records = read_output(bootstrap, out)
    if not records:
        return {"workload": workload, "engine": engine, "ok": False, "problem": "no output"}
    first, last = min(r[2] for r in records), max(r[2] for r in records)
    problem = verify(workload, records, expected)
    return {"workload": workload, "engine": engine, "ok": not problem, "problem": problem,
            "rate": expected["n"] / max((last - first) / 1000, 0.001), "outputs": len(records),
            "span_s": (last - first) / 1000, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "peers-results.json"))
    ap.add_argument("--child-raw", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_raw:
        raw_filter_loop(*args.child_raw)
        return
    workloads = args.workloads.split(",")
    engines = args.engines.split(",")
    kafka_streams.compiled()   # fetch, compile and install before anything is timed
    for e in engines:
        if e in ("quixstreams", "faust"):
            peer_python(e)
    runs = []
    with broker(args.bootstrap_servers, apache_kafka=not args.bootstrap_servers) as bootstrap, \
            tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        prefix = f"peers-{uuid.uuid4().hex[:6]}-"
        t = time.monotonic()
        expected = load(bootstrap, prefix, args.records)
        print(f"loaded {args.records:,} records x 3 topics + {CUSTOMERS:,} customers "
              f"in {time.monotonic() - t:.1f} s", flush=True)
        for rep in range(args.reps):
            for w in workloads:
                for e in engines:
                    if w not in OFFERS.get(e, WORKLOADS):
                        continue
                    r = run_one(bootstrap, prefix, w, e, expected, Path(tmp))
                    r["rep"] = rep
                    runs.append(r)
                    figures = (f"rate={r['rate']:,.0f}/s outputs={r['outputs']} span={r['span_s']:.2f}s "
                               f"wall={r['wall_s']:.1f}s" if "rate" in r else "")
                    print(f"rep={rep} workload={w} engine={e} {figures}"
                          + (" ok" if r["ok"] else f" WRONG: {r['problem']}"), flush=True)
    table(runs, workloads, engines)
    with open(args.json, "a") as f:
        f.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "records": args.records, "runs": runs}) + "\n")
    if not all(r["ok"] for r in runs):
        sys.exit(1)


def table(runs: list[dict], workloads: list[str], engines: list[str]) -> None:
    med = {}
    for w in workloads:
        for e in engines:
            rates = [r["rate"] for r in runs if r["workload"] == w and r["engine"] == e and r["ok"]]
            if rates:
                med[w, e] = statistics.median(rates)
    groups = [("Kafka Streams (cache, no cache)", ("kafka-streams", "kafka-streams-nocache")),
              ("Quix Streams, Faust", ("quixstreams", "faust"))]
    print("\n| workload | " + " | ".join(engines) + " | " + " | ".join(f"processor / {g}" for g, _ in groups) + " |")
    print("|---|" + "---|" * (len(engines) + len(groups)))
    for w in workloads:
        cells = [f"{med[w, e] / 1000:.1f}k" if (w, e) in med else "-" if w in OFFERS.get(e, WORKLOADS) else "n/a"
                 for e in engines]
        ratios = [" / ".join(f"{med[w, 'processor'] / med[w, e]:.2f}x" if (w, e) in med and (w, "processor") in med
                             else "-" for e in members) for _, members in groups]
        print(f"| {w} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
