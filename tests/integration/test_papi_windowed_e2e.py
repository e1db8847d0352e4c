"""Processor API window and session stores (issue 34 item 4) on a real broker: a ``Worker`` over
1,500 records on 3 partitions (out of time order, over many store segments) runs Kafka Streams'
EventDeduplication on a window store and a sessionizer on a session store.

- Outputs: per key, exactly the test driver's sequence over each input partition.
- Stores: the worker's task ``0_<p>`` column families (the stores and the bookkeeping holding
  each store's observed stream time) byte for byte the driver's; a second worker on an empty
  state directory restores them from their changelogs byte for byte; ``processor state dump``
  prints every entry with its window / session bounds."""

import io
import json
import random

from processor import Stores, StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime import state_inspect
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.state import papi_window_key
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import produce, task_store_bytes, worker_equals_driver_per_partition
from tests.unit.test_papi_session_store import Sessionizer
from tests.unit.test_papi_window_store import Deduplication

MAINTAIN_MS = 100_000
STORES = ("eventId-store", "sessions", "_bookkeeping")


class WideSessionizer(Sessionizer):
    GAP = 60_000


def topology_for(t, id_of=lambda k, v: f"{k}:{v['x']}"):
    """``id_of``: the event id (the store's key; interactive queries find a key in the partition
    the input's partitioner gives it, so a queried store is keyed by the record key)."""
    b = StreamsBuilder()
    b.add_state_store(Stores.window("eventId-store", MAINTAIN_MS, MAINTAIN_MS, key_serde=Serdes.string(),
                                    value_serde=Serdes.json()))
    b.add_state_store(Stores.session("sessions", 200_000))
    s = b.stream(t["in"])
    s.process(lambda: Deduplication(MAINTAIN_MS, id_of), stores=["eventId-store"]) \
        .to(t["unique"])
    s.process(WideSessionizer, stores=["sessions"]).to(t["sessions"])
    return b.build()


def test_window_and_session_stores_on_the_broker_equal_the_driver_and_restore(kafka_bootstrap, unique, tmp_path):
    t = {n: f"pws-{n}-{unique}" for n in ("in", "unique", "sessions")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    rnd = random.Random(34)
    records, stamps, clock = [], [], 0
    for _ in range(1500):
        clock += rnd.choice([0, 100, 500, 1_500, 3_000])
        stamps.append(max(1, clock - rnd.choice([0, 0, 0, 700, 5_000])))   # (0 is the producer's "now")
        records.append((f"u{rnd.randrange(30):02d}".encode(), json.dumps({"x": rnd.randrange(6)}).encode()))
    produce(kafka_bootstrap, t["in"], records, timestamps=stamps)
    app = f"pws-{unique}"
    want, _ = worker_equals_driver_per_partition(kafka_bootstrap, topology_for, t, app, tmp_path / "w1", t["in"],
                                                 [t["unique"], t["sessions"]], STORES[:2])
    n_unique = sum(map(len, want[t["unique"]].values()))
    assert 180 < n_unique < 1200                      # duplicates dropped, forgotten ids forwarded again
    assert sum(map(len, want[t["sessions"]].values())) == 1500
    assert any(json.loads(v)[2] > 3 for vs in want[t["sessions"]].values() for v, _ in vs)   # merged sessions

    first = {p: task_store_bytes([tmp_path / "w1" / app / f"task-0_{p}"], STORES) for p in range(3)}
    for p in range(3):
        assert len(first[p]["_bookkeeping"]) == 3      # the task's stream time, each store's clock
        assert len(first[p]["eventId-store"]) > 20 and len(first[p]["sessions"]) > 5
        # the oldest segments (the input starts at 0) were purged as the stores' clocks moved
        for store in ("eventId-store", "sessions"):
            assert min(papi_window_key.decode_any(k)[0] for k in first[p][store]) >= 5, (p, store)
    # a second worker on an empty state directory restores the stores from their changelogs
    w2 = Worker(topology_for(t), kafka_bootstrap, app, tmp_path / "w2", commit_interval_ms=200,
                consumer_config=TEST_CONSUMER_CONFIG)
    w2.run(until_drained=True, install_signal_handlers=False)
    assert w2.records_processed == 0
    for p in range(3):
        assert task_store_bytes([tmp_path / "w2" / app / f"task-0_{p}"], STORES) == first[p], p

    # `processor state dump` decodes every entry with its window / session bounds
    out = io.StringIO()
    n = state_inspect.dump(topology_for(t), app, tmp_path / "w2", store="eventId-store", out=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert n == len(lines) == sum(len(first[p]["eventId-store"]) for p in range(3))
    assert all(e["window_end"] == e["window_start"] + MAINTAIN_MS and e["value"] == e["window_start"] and
               e["timestamp"] == e["window_start"] for e in lines)
    out = io.StringIO()
    state_inspect.dump(topology_for(t), app, tmp_path / "w2", store="sessions", out=out)
    sessions = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(sessions) == sum(len(first[p]["sessions"]) for p in range(3))
    assert all(e["session_start"] <= e["session_end"] and e["value"] >= 1 for e in sessions)


def test_a_window_store_answers_a_key_with_its_live_windows_while_the_worker_runs(kafka_bootstrap, unique,
                                                                                  tmp_path):
    """``worker.store(name).entry(key)`` (what ``/stores/<name>/<key>`` serves) of a window store:
    the key's live windows, as the driver's store fetches them; a prefix scan is refused. The
    event id is the record key here: a key is looked up in the partition it belongs to."""
    import threading

    import pytest

    from processor.runtime.interactive_queries import QueryError
    from processor.testing import TopologyTestDriver
    from tests.integration.helpers import wait_until_tasks_committed

    t = {n: f"pwq-{n}-{unique}" for n in ("in", "unique", "sessions")}
    kafka.create_topics(kafka_bootstrap, {v: 3 for v in t.values()})
    rnd = random.Random(9)
    records = [(f"u{rnd.randrange(10):02d}".encode(), json.dumps({"x": rnd.randrange(3)}).encode())
               for _ in range(300)]
    stamps = [1_000_000 + i * 1_000 for i in range(300)]   # (a timestamp 0 is the producer's "now")
    produce(kafka_bootstrap, t["in"], records, timestamps=stamps)
    app = f"pwq-{unique}"
    def topo():
        return topology_for(t, id_of=lambda k, v: k)

    w = Worker(topo(), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    runner = threading.Thread(target=lambda: w.run(install_signal_handlers=False), daemon=True)
    runner.start()
    try:
        wait_until_tasks_committed(kafka_bootstrap, topo().for_application(app), {t["in"]: 3},
                                   "read_uncommitted", timeout_s=60)
        inputs = kafka.read_topic(kafka_bootstrap, t["in"])
        want = {}
        for p in range(3):
            with TopologyTestDriver(topo(), application_id=app) as d:
                for m in (m for m in inputs if m.partition() == p):
                    d.pipe_raw(t["in"], m.key(), m.value(), m.timestamp()[1])
                store = d.get_store("eventId-store")
                for k in sorted({m.key().decode() for m in inputs if m.partition() == p}):
                    want[k] = [(s, s + MAINTAIN_MS, v) for s, v in store.fetch(k, 0, 10**12)]
        view = w.store("eventId-store")
        got = {}
        for eid in sorted(want):
            e = view.entry(eid)
            assert e["key"] == eid and e["task"] == f"0_{e['partition']}"
            got[eid] = [(x["window_start"], x["window_end"], x["value"]) for x in e["windows"]]
        assert got == want
        assert len(want) == 10 and all(len(v) > 2 for v in want.values())
        assert view.entry("u99") is None
        with pytest.raises(QueryError, match="is a window store: it answers a key"):
            view.prefix("u0")
    finally:
        w.stop()
        runner.join(60)
    assert not runner.is_alive()
