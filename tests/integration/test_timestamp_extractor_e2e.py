"""Timestamp extractors on a real broker (issue 34): a worker over 2 partitions, the history
produced before it starts with broker timestamps running backwards and the event time in the
payload; some records' extractions fail (no time, a negative one, text).

- The good records: a stream-table join (each click with the region of its event time) and a
  windowed count by event time, per key in order and in the stores byte for byte, equal the
  test driver's fed each partition in event-time order, and the model's join results.
- The bad ones: exactly those records, as they were (key, value, broker timestamp), in the
  dead-letter topic with a reason naming the extractor and the source step; nothing lost (every
  click is joined or dead-lettered)."""

import json

from processor import StreamsBuilder, TimeWindows
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import by_key, driver_store_bytes, produce, task_store_bytes

PARTS = 2
BROKER_T0 = 5_000_000_000
STORES = ("users", "per-10s")


def payload_time(k, v, ts):
    return v["t"]


def topology_for(t):
    b = StreamsBuilder()
    users = b.table(t["users"], store_name="users", timestamp_extractor=payload_time)
    clicks = b.stream(t["clicks"], timestamp_extractor=payload_time)
    clicks.join(users, lambda c, u: {"c": c["n"], "r": u["r"]}).to(t["out"])
    clicks.group_by_key().windowed_by(TimeWindows.of(10_000)).count(name="per-10s")
    return b.build()


def history():
    """{topic name: [(key, value dict, broker timestamp)]}, each topic in event-time order; bad
    records (no "t", a negative one, text) at their place in the topic."""
    users, clicks = [], []
    for i in range(20):
        users.append((f"u{i:02d}", {"r": "A", "t": 1_000 + i}))
    users.append(("u03", {"r": "Z"}))                      # no time: dead-lettered
    for i in range(20):
        users.append((f"u{i:02d}", {"r": "B", "t": 100_000 + i}))
    for i in range(20):
        clicks.append((f"u{i:02d}", {"n": i, "t": 50_000 + i}))
        if i % 7 == 3:
            clicks.append((f"u{i:02d}", {"n": 100 + i, "t": -5}))
        if i % 7 == 5:
            clicks.append((f"u{i:02d}", {"n": 200 + i, "t": "soon"}))
    for i in range(20):
        clicks.append((f"u{i:02d}", {"n": 20 + i, "t": 150_000 + i}))
    stamp = lambda rows: [(k, v, BROKER_T0 - j) for j, (k, v) in enumerate(rows)]   # noqa: E731
    return {"users": stamp(users), "clicks": stamp(clicks)}


def good(v) -> bool:
    return isinstance(v.get("t"), int) and not isinstance(v["t"], bool) and v["t"] >= 0


def produce_history(bootstrap, t, h):
    for name in ("clicks", "users"):   # the stream first: fetch order alone would be wrong
        produce(bootstrap, t[name], [(k.encode(), json.dumps(v).encode()) for k, v, _ in h[name]],
                timestamps=[ts for _, _, ts in h[name]])


def model_joined(h):
    out = {}
    for k, v, _ in h["clicks"]:
        if good(v):
            out.setdefault(k.encode(), []).append(({"c": v["n"], "r": "A" if v["t"] < 100_000 else "B"}, v["t"]))
    return out


def driver_run(t, inputs, app):
    """The driver fed each partition in event-time order (a bad record first, as
    ``Task.event_time``): outputs by key, stores per partition, dead-lettered (key, value, ts)."""
    out, stores, dlq = {}, {}, []
    for part in range(PARTS):
        def when(m):
            v = json.loads(m.value())
            return v["t"] if good(v) else -1   # a failed extraction goes first (Task.event_time)
        merged = sorted(((when(m), t[name], m.offset(), m) for name, ms in inputs.items()
                         for m in ms if m.partition() == part), key=lambda r: r[:3])
        with TopologyTestDriver(topology_for(t), application_id=app) as d:
            for _, topic, _, m in merged:
                d.pipe_raw(topic, m.key(), m.value(), m.timestamp()[1])
            for r in d.read_output(t["out"], Serdes.bytes(), Serdes.bytes()):
                out.setdefault(r.key, []).append((r.value, r.timestamp))
            dlq += [(r.key, r.value, r.timestamp) for r in d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())]
            stores[part] = driver_store_bytes(d, STORES)
    return out, stores, sorted(dlq)


def check_dead_letters(got_dlq, h):
    """Exactly the bad records, as they were, each with the extractor named in its reason."""
    bad = sorted((k.encode(), json.dumps(v).encode(), ts) for name in ("users", "clicks")
                 for k, v, ts in h[name] if not good(v))
    assert sorted((m.key(), m.value(), m.timestamp()[1]) for m in got_dlq) == bad
    for m in got_dlq:
        headers = dict(m.headers())
        assert b"timestamp extractor" in headers["__streams.errors.message"], headers
        assert headers["processor.errors.step"].startswith(b"K"), headers   # the source step
    return bad


def test_event_time_from_the_payload_on_the_broker(kafka_bootstrap, unique, tmp_path):
    t = {n: f"tx-{n}-{unique}" for n in ("users", "clicks", "out")}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    h = history()
    produce_history(kafka_bootstrap, t, h)
    app = f"tx-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    got = by_key(kafka.read_topic(kafka_bootstrap, t["out"]))
    assert {k: [(json.loads(v), ts) for v, ts in seq] for k, seq in got.items()} == model_joined(h)
    bad = check_dead_letters(kafka.read_topic(kafka_bootstrap, f"{app}-dlq"), h)
    assert w.metrics()["task"]["dead_lettered"] == len(bad) == 7
    clicks = sum(1 for _, v, _ in h["clicks"])
    assert sum(map(len, got.values())) + sum(1 for k, v, ts in bad if b'"n"' in v) == clicks   # nothing lost

    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks")}
    want, stores, want_dlq = driver_run(t, inputs, app)
    assert got == want
    assert want_dlq == sorted((k.encode(), json.dumps(v).encode(), ts) for name in ("users", "clicks")
                              for k, v, ts in h[name] if not good(v))
    subs = w.topology.subtopology_of_topic()
    for part in range(PARTS):
        assert task_store_bytes([tmp_path / app / f"task-{subs[t['users']]}_{part}"], STORES) == stores[part], part
