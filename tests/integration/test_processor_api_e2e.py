"""The Processor API (issue 29) on a real broker: a ``Worker`` over 3,000 records on 3
partitions runs a dedup processor with a store and a counter with stream-time punctuation.

- Outputs: per key, exactly the sequence the test driver gives per input partition (each
  task's punctuations keyed by its partition, so they are a per-key sequence too).
- The user stores are real stores: byte for byte the driver's, and a second worker on an empty
  state directory restores them from their changelogs byte for byte."""

import json
import random
import time
from collections import defaultdict

from processor import Processor, Record, Stores, StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, task_store_bytes
from tests.unit.test_processor_api import Dedup

STORES = ("seen", "n", "_bookkeeping")


class PartitionTicker(Processor):
    """Counts records; every 25 ms of stream time forwards (``tick-<partition>``, count)."""

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("n")
        context.schedule(25, "stream", self.tick)

    def tick(self, ts):
        self.ctx.forward(Record(f"tick-{self.ctx.partition}", self.store.get("n") or 0, ts))

    def process(self, record):
        self.store.put("n", (self.store.get("n") or 0) + 1)


def topology_for(t):
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.add_state_store(Stores.key_value("n"))
    s = b.stream(t["in"])
    s.process(Dedup, stores=["seen"]).to(t["out"])
    s.process(PartitionTicker, stores=["n"]).to(t["ticks"])
    return b.build()


def test_processor_api_on_the_broker_equals_the_driver_and_restores(kafka_bootstrap, unique, tmp_path):
    t = {n: f"pa-{n}-{unique}" for n in ("in", "out", "ticks")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    rnd = random.Random(31)
    records = [(f"k{rnd.randrange(200):03d}".encode(), json.dumps({"x": rnd.randrange(90)}).encode())
               for _ in range(3000)]
    produce(kafka_bootstrap, t["in"], records)
    app = f"pa-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path / "w1", commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)

    inputs = kafka.read_topic(kafka_bootstrap, t["in"])
    want: dict = {o: defaultdict(list) for o in (t["out"], t["ticks"])}
    task_stores = {}
    for p in range(3):
        with TopologyTestDriver(topology_for(t), application_id=app) as d:
            for m in (m for m in inputs if m.partition() == p):
                d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
            for o in want:
                for r in d.read_output(o, Serdes.bytes(), Serdes.bytes()):
                    # the driver's one task is partition 0: its ticks are the worker's task p's
                    key = f"tick-{p}".encode() if o == t["ticks"] else r.key
                    want[o][key].append((r.value, r.timestamp))
            task_stores[p] = driver_store_bytes(d, STORES[:2])
            task_stores[p]["_bookkeeping"] = dict(d.tasks[0].stores.store("_bookkeeping").items())
    for o in want:
        got = by_key(kafka.read_topic(kafka_bootstrap, o))
        assert got == want[o], o
    assert sum(map(len, want[t["out"]].values())) == 200
    assert sorted(want[t["ticks"]]) == [b"tick-0", b"tick-1", b"tick-2"]
    assert all(len(v) > 20 for v in want[t["ticks"]].values())

    for p in range(3):
        got = task_store_bytes([tmp_path / "w1" / app / f"task-0_{p}"], STORES)
        assert got == task_stores[p], p
        assert len(got["_bookkeeping"]) == 2   # the task's stream time, the ticker's next punctuation

    # a second worker on an empty state directory restores the stores from their changelogs
    w2 = Worker(topology_for(t), kafka_bootstrap, app, tmp_path / "w2", commit_interval_ms=200,
                consumer_config=TEST_CONSUMER_CONFIG)
    w2.run(until_drained=True, install_signal_handlers=False)
    assert w2.records_processed == 0
    for p in range(3):
        got = task_store_bytes([tmp_path / "w2" / app / f"task-0_{p}"], STORES)
        assert got == task_stores[p], p

    # the user store is dumped by `processor state dump` like every store
    import io

    from processor.runtime import state_inspect

    out = io.StringIO()
    n = state_inspect.dump(topology_for(t), app, tmp_path / "w2", store="seen", out=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert n == len(lines) == 200
    assert {(e["key"], json.dumps(e["value"])) for e in lines} == \
        {(k.decode(), json.dumps(json.loads(v[8:]))) for p in range(3) for k, v in task_stores[p]["seen"].items()}


class WallTicker(Processor):
    """Every 100 ms of the worker's wall clock forwards how many records its task has seen."""

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("n")
        context.schedule(100, "wall", self.tick)

    def tick(self, now):
        self.ctx.forward(Record(f"tick-{self.ctx.partition}", self.store.get("n") or 0, now))

    def process(self, record):
        self.store.put("n", (self.store.get("n") or 0) + 1)


def test_wall_clock_punctuation_runs_on_the_worker(kafka_bootstrap, unique, tmp_path):
    t = {n: f"paw-{n}-{unique}" for n in ("in", "ticks")}
    kafka.create_topics(kafka_bootstrap, {v: 1 for v in t.values()})
    produce(kafka_bootstrap, t["in"], [(f"k{i}".encode(), b"{}") for i in range(500)])
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream(t["in"]).process(WallTicker, stores=["n"]).to(t["ticks"])
    started = time.time() * 1000
    w = Worker(b.build(), kafka_bootstrap, f"paw-{unique}", tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(max_seconds=4, install_signal_handlers=False)
    ticks = [(int(m.value()), m.timestamp()[1]) for m in kafka.read_topic(kafka_bootstrap, t["ticks"])]
    assert len(ticks) >= 5, ticks
    assert [n for n, _ in ticks] == sorted(n for n, _ in ticks) and ticks[-1][0] == 500
    stamps = [ts for _, ts in ticks]
    assert stamps == sorted(stamps) and stamps[0] >= started
    assert all(b - a >= 100 for a, b in zip(stamps, stamps[1:], strict=False))   # at most one per interval


def test_a_user_store_is_queryable_while_the_worker_runs(kafka_bootstrap, unique, tmp_path):
    """``worker.store(name)`` (what ``/stores`` serves) reads a Processor API store like any
    key-value store: every key the dedup saw, with its first value."""
    import threading

    from tests.integration.helpers import wait_until_tasks_committed

    t = {n: f"paq-{n}-{unique}" for n in ("in", "out", "ticks")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    rnd = random.Random(5)
    records = [(f"k{rnd.randrange(50):02d}".encode(), json.dumps({"x": i}).encode()) for i in range(600)]
    produce(kafka_bootstrap, t["in"], records)
    app = f"paq-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    runner = threading.Thread(target=lambda: w.run(install_signal_handlers=False), daemon=True)
    runner.start()
    try:
        wait_until_tasks_committed(kafka_bootstrap, topology_for(t).for_application(app), {t["in"]: 3},
                                   "read_uncommitted", timeout_s=60)
        first: dict = {}
        for k, v in records:
            first.setdefault(k.decode(), json.loads(v))
        view = w.store("seen")
        assert {k: view.get(k) for k in sorted(first)} == {k: first[k] for k in sorted(first)}
        assert view.get("no-such-key") is None
    finally:
        w.stop()
        runner.join(60)
    assert not runner.is_alive()
