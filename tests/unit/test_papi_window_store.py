"""Processor API window stores (issue 34 item 4): ``Stores.window`` in the test driver against a
plain-Python model of Kafka Streams' ``RocksDBWindowStore`` rules (put/replace/delete, duplicates
with sequence numbers, retention by the store's observed stream time), exact lists; Kafka
Streams' EventDeduplication example ported with its own inputs and expected output."""

import random

import pytest

from processor import Processor, Stores, StreamsBuilder
from processor.errors import TopologyError
from processor.serde import Serdes
from processor.state import papi_window_key
from processor.testing import TopologyTestDriver


class WindowScript(Processor):
    """Each record's value is one operation on window store ``w``; reads are forwarded."""

    def init(self, context):
        self.ctx = context
        self.w = context.get_state_store("w")

    def process(self, record):
        a = record.value
        op = a["op"]
        if op == "put":
            self.w.put(record.key, a["v"], a["start"])
            return
        if op == "fetch":
            out = [[t, v] for t, v in self.w.fetch(record.key, a["from"], a["to"])]
        elif op == "bfetch":
            out = [[t, v] for t, v in self.w.backward_fetch(record.key, a["from"], a["to"])]
        elif op == "all":
            out = [[w.key, w.start, w.end, v] for w, v in self.w.fetch_all(a["from"], a["to"])]
        else:
            out = [[w.key, w.start, w.end, v] for w, v in self.w.backward_fetch_all(a["from"], a["to"])]
        self.ctx.forward(record._replace(value=out))


class WindowModel:
    """Kafka Streams' window store as read from its source: the store's clock is the largest
    window start put; a put at or before clock - retention is dropped; reads start at
    clock - retention + 1; without duplicates a put replaces (None deletes), with them every
    non-None put is a new entry (a None put does nothing at all)."""

    def __init__(self, retention, size, dups):
        self.retention, self.size, self.dups = retention, size, dups
        self.rows: dict = {}          # (key, start, seq) -> value
        self.clock, self.seq = -1, 0

    def put(self, k, v, start):
        if v is None and self.dups:
            return
        if self.dups:
            self.seq += 1
        self.clock = max(self.clock, start)
        if start <= self.clock - self.retention:
            return
        if self.dups:
            self.rows[(k, start, self.seq)] = v
        elif v is None:
            self.rows.pop((k, start, 0), None)
        else:
            self.rows[(k, start, 0)] = v

    def live(self, lo, hi):
        lo = max(lo, self.clock - self.retention + 1)
        return sorted((s, k.encode(), q, k, v) for (k, s, q), v in self.rows.items() if lo <= s <= hi)

    def fetch(self, k, lo, hi):
        return [[s, v] for s, _, _, kk, v in self.live(lo, hi) if kk == k]

    def fetch_all(self, lo, hi):
        return [[k, s, s + self.size, v] for s, _, _, k, v in self.live(lo, hi)]


def script_topology(retention, size, dups):
    b = StreamsBuilder()
    b.add_state_store(Stores.window("w", retention, size, retain_duplicates=dups,
                                    key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.stream("in").process(WindowScript, stores=["w"]).to("out")
    return b.build()


def script_ops(seed, n=600, step=5_000, retention=200_000):
    """Operations over a clock that moves ~``step`` per record through many segments (the
    segment interval is max(retention // 2, 60,000)); keys that prefix each other; puts now and
    then older than the retention; deletes; reads over ranges reaching past both ends."""
    rnd = random.Random(seed)
    keys = ["a", "ab", "abc", "b", "k\x00", "k"]
    ops, t = [], 0
    for i in range(n):
        t += rnd.choice([0, step, step, 2 * step, -step])
        t = max(t, 0)
        k = rnd.choice(keys)
        r = rnd.random()
        if r < 0.5:
            start = max(0, t - rnd.choice([0, 0, 1_000, 30_000, retention - 1, retention, retention + 5,
                                           2 * retention]))
            ops.append((k, {"op": "put", "v": i, "start": start}, t))
        elif r < 0.6:
            start = max(0, t - rnd.choice([0, 5_000, 10_000]))
            ops.append((k, {"op": "put", "v": None, "start": start}, t))
        else:
            lo = t - rnd.choice([0, 20_000, retention, 3 * retention])
            hi = t + rnd.choice([0, 10_000, -30_000])
            op = rnd.choice(["fetch", "bfetch", "all", "ball"])
            ops.append((k, {"op": op, "from": lo, "to": hi}, t))
    return ops


def model_outputs(ops, retention, size, dups):
    m = WindowModel(retention, size, dups)
    want = []
    for k, a, _ in ops:
        if a["op"] == "put":
            m.put(k, a["v"], a["start"])
        elif a["op"] in ("fetch", "bfetch"):
            got = m.fetch(k, a["from"], a["to"])
            want.append((k, got if a["op"] == "fetch" else got[::-1]))
        else:
            got = m.fetch_all(a["from"], a["to"])
            want.append((k, got if a["op"] == "all" else got[::-1]))
    return want, m


@pytest.mark.parametrize("dups", [False, True])
def test_window_store_reads_follow_the_model(dups):
    retention, size = 200_000, 50_000
    ops = script_ops(11 if dups else 12, retention=retention)
    want, model = model_outputs(ops, retention, size, dups)
    with TopologyTestDriver(script_topology(retention, size, dups)) as d:
        for k, v, ts in ops:
            d.pipe_input("in", k, v, timestamp=ts)
        got = [(r.key, r.value) for r in d.read_output("out")]
        store = d.get_store("w")
        raw = store.raw()
        observed = store.observed_stream_time
    assert got == want
    assert sum(1 for _, v in want if len(v) > 2) > 40          # reads that saw several windows
    assert observed == model.clock
    # the store holds exactly the model's entries of the segments retention has not dropped
    interval = papi_window_key.segment_interval(retention)
    min_live = (model.clock - retention) // interval
    kept = sorted(((k, s, s + size), q, v) for (k, s, q), v in model.rows.items() if s // interval >= min_live)
    assert sorted(((w.key, w.start, w.end), seq, v) for (w, seq), v in raw) == kept
    assert len(model.rows) > len(kept) > 10                        # segments were purged
    if dups:
        assert any(s > 1 for (_, _, s) in model.rows)
        assert len({(k, s) for (k, s, _) in model.rows}) < len(model.rows)   # duplicates kept


def test_duplicates_are_kept_in_put_order_and_a_none_put_changes_nothing():
    with TopologyTestDriver(script_topology(100_000, 10_000, True)) as d:
        for i, (v, start) in enumerate([("x", 10), ("y", 10), ("x", 10), (None, 10), ("z", 5), (None, 500_000)]):
            d.pipe_input("in", "k", {"op": "put", "v": v, "start": start}, timestamp=i)
        d.pipe_input("in", "k", {"op": "fetch", "from": 0, "to": 100}, timestamp=9)
        d.pipe_input("in", "k", {"op": "bfetch", "from": 0, "to": 100}, timestamp=9)
        assert [r.value for r in d.read_output("out")] == [[[5, "z"], [10, "x"], [10, "y"], [10, "x"]],
                                                           [[10, "x"], [10, "y"], [10, "x"], [5, "z"]]]
        # the None put at 500,000 did not move the store's clock (nothing expired)
        assert d.get_store("w").observed_stream_time == 10
        assert [seq for (_, seq), _ in d.get_store("w").raw()] == [4, 1, 2, 3]   # by window start, then seq


def test_without_duplicates_a_put_replaces_and_none_deletes_expired_puts_are_dropped():
    with TopologyTestDriver(script_topology(1_000, 100, False)) as d:
        for i, (v, start) in enumerate([("x", 10), ("y", 10), ("w", 20), (None, 20), ("late", 9),
                                        ("now", 1_010), ("old", 10), ("edge", 11)]):
            d.pipe_input("in", "k", {"op": "put", "v": v, "start": start}, timestamp=i)
        d.pipe_input("in", "k", {"op": "fetch", "from": 0, "to": 5_000}, timestamp=9)
        d.pipe_input("in", "k", {"op": "all", "from": 0, "to": 5_000}, timestamp=9)
        # 10 is at clock (1,010) - retention: expired, and "old" at 10 was dropped; 11 is live
        assert [r.value for r in d.read_output("out")] == [[[11, "edge"], [1_010, "now"]],
                                                           [["k", 11, 111, "edge"], ["k", 1_010, 1_110, "now"]]]
        assert d.metrics()  # (the driver's metrics name the dropped put)
        assert any(m.get("expired_puts_dropped") == 1 for m in d.metrics().values() if isinstance(m, dict))


def test_window_store_settings_are_checked():
    with pytest.raises(TopologyError, match="no smaller than the window size"):
        Stores.window("w", 10, 20)
    with pytest.raises(TopologyError, match="retention_ms is an int >= 0"):
        Stores.window("w", -1, 0)
    with pytest.raises(TopologyError, match="not starting with '_'"):
        Stores.window("_w", 10, 5)


class Failing(Processor):
    def init(self, context):
        self.w = context.get_state_store("w")

    def process(self, record):
        self.w.put(record.key, record.value, record.timestamp)
        if record.value == "boom":
            raise ValueError("boom")


def test_a_failed_record_leaves_no_window_entry_and_no_clock_advance():
    b = StreamsBuilder()
    b.add_state_store(Stores.window("w", 1_000, 10, retain_duplicates=True))
    b.stream("in").process(Failing, stores=["w"]).to("out")
    with TopologyTestDriver(b.build(), on_error="dlq") as d:
        d.pipe_input("in", "k", "a", timestamp=100)
        d.pipe_input("in", "k", "boom", timestamp=5_000)     # dead-lettered: its put undone
        d.pipe_input("in", "k", "b", timestamp=200)
        store = d.get_store("w")
        assert store.fetch("k", 0, 10_000) == [(100, "a"), (200, "b")]
        assert store.observed_stream_time == 200
        assert [seq for (_, seq), _ in store.raw()] == [1, 2]     # the failed put's sequence undone too
        assert len(d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())) == 1


# -- Kafka Streams' EventDeduplication example -------------------------------------------------
class Deduplication(Processor):
    """Port of the kafka-streams-examples ``DeduplicationTransformer``: an event id seen within
    ``maintain_ms`` around the record's time (half before, half after) is a duplicate: dropped,
    and its id's window moved to the record's time so it does not expire; otherwise forwarded and
    remembered. A null id is forwarded as it is."""

    def __init__(self, maintain_ms, id_extractor):
        self.left = maintain_ms // 2
        self.right = maintain_ms - self.left
        self.id_of = id_extractor

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("eventId-store")

    def process(self, record):
        event_id = self.id_of(record.key, record.value)
        if event_id is None:
            self.ctx.forward(record)
            return
        t = record.timestamp
        if self.store.fetch(event_id, t - self.left, t + self.right):
            self.store.put(event_id, t, t)
        else:
            self.store.put(event_id, t, t)
            self.ctx.forward(record)


MAINTAIN_MS = 10 * 60 * 1000


def dedup_topology(maintain_ms=MAINTAIN_MS):
    b = StreamsBuilder()
    b.add_state_store(Stores.window("eventId-store", maintain_ms, maintain_ms, key_serde=Serdes.string(),
                                    value_serde=Serdes.json()))
    b.stream("inputTopic", key_serde=Serdes.bytes(), value_serde=Serdes.string()) \
        .process(lambda: Deduplication(maintain_ms, lambda k, v: v), stores=["eventId-store"]) \
        .to("outputTopic")
    return b.build()


def test_event_deduplication_example_with_its_own_inputs():
    first, second, third = "4ff3cb44-abcb-46e3-8f9a-afb7cc74fbb8", "7a1b0c6e-0000-4e0b-9f7e-1d5f1c2a3b4c", \
        "0c7e2f52-1111-4d2a-8f00-9a8b7c6d5e4f"
    inputs = [first, second, first, first, second, third, third, first, second]
    with TopologyTestDriver(dedup_topology()) as d:
        for i, v in enumerate(inputs):
            d.pipe_input("inputTopic", None, v, timestamp=1_700_000_000_000 + i * 1_000)
        assert [r.value for r in d.read_output("outputTopic")] == [first, second, third]


def dedup_model(records, maintain_ms):
    """The example's rule over a plain list of remembered (id, time) windows, with the store's
    retention (maintain_ms after the largest window start put)."""
    left, right = maintain_ms // 2, maintain_ms - maintain_ms // 2
    windows: dict = {}
    clock, out = -1, []
    for _i, (eid, t) in enumerate(records):
        live_from = max(t - left, clock - maintain_ms + 1)
        dup = any(live_from <= s <= t + right for s in windows.get(eid, ()))
        clock = max(clock, t)
        if t > clock - maintain_ms:
            windows.setdefault(eid, set()).add(t)
        if not dup:
            out.append((eid, t))
    return out


def test_event_deduplication_over_time_follows_the_model():
    """Ids repeat within and beyond the maintain duration, some records out of order: an id is a
    duplicate only while a remembered window of it is within the duration around the record."""
    maintain = 60_000
    rnd = random.Random(34)
    records, t = [], 0
    for _ in range(800):
        t += rnd.choice([0, 500, 1_000, 2_000, 20_000, -3_000])
        t = max(t, 0)
        records.append((f"id{rnd.randrange(40)}", t))
    want = dedup_model(records, maintain)
    with TopologyTestDriver(dedup_topology(maintain)) as d:
        for eid, ts in records:
            d.pipe_input("inputTopic", None, eid, timestamp=ts)
        got = [(r.value, r.timestamp) for r in d.read_output("outputTopic")]
    assert got == want
    assert 100 < len(want) < 700          # both duplicates and forgotten ids
