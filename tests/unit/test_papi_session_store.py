"""Processor API session stores (issue 34 item 4): ``Stores.session`` in the test driver against
a plain-Python model of Kafka Streams' ``RocksDBSessionStore`` rules (``find_sessions`` by end
and start bounds, ``remove``, ``fetch``, retention by the store's observed stream time: the
largest session end put or removed), exact lists; a session-merging processor written on it."""

import random

import pytest

from processor import Processor, Stores, StreamsBuilder, Windowed
from processor.errors import TopologyError
from processor.serde import Serdes
from processor.state import papi_window_key
from processor.testing import TopologyTestDriver


class SessionScript(Processor):
    """Each record's value is one operation on session store ``s``; reads are forwarded."""

    def init(self, context):
        self.ctx = context
        self.s = context.get_state_store("s")

    def process(self, record):
        a, k = record.value, record.key
        op = a["op"]
        if op == "put":
            self.s.put(Windowed(k, a["start"], a["end"]), a["v"])
            return
        if op == "remove":
            self.s.remove(Windowed(k, a["start"], a["end"]))
            return
        if op == "get":
            out = self.s.fetch_session(k, a["start"], a["end"])
        else:
            rows = {"find": lambda: self.s.find_sessions(k, a["ee"], a["ls"]),
                    "bfind": lambda: self.s.backward_find_sessions(k, a["ee"], a["ls"]),
                    "fetch": lambda: self.s.fetch(k),
                    "bfetch": lambda: self.s.backward_fetch(k)}[op]()
            out = [[w.key, w.start, w.end, v] for w, v in rows]
        self.ctx.forward(record._replace(value=out))


class SessionModel:
    """Kafka Streams' session store as read from its source: the clock is the largest session end
    put or removed; a put ending at or before clock - retention is dropped; reads see sessions
    ending after clock - retention; ``find_sessions(k, ee, ls)``: end >= ee and start <= ls, by
    end then start."""

    def __init__(self, retention):
        self.retention = retention
        self.rows: dict = {}      # (key, start, end) -> value
        self.clock = -1

    def put(self, k, s, e, v):
        if v is None:
            self.remove(k, s, e)
            return
        self.clock = max(self.clock, e)
        if e > self.clock - self.retention:
            self.rows[(k, s, e)] = v

    def remove(self, k, s, e):
        self.clock = max(self.clock, e)
        self.rows.pop((k, s, e), None)

    def find(self, k, ee, ls):
        lo = max(ee, self.clock - self.retention + 1)
        return [[k, s, e, v] for (e, s), v in sorted(((e, s), v) for (kk, s, e), v in self.rows.items()
                                                     if kk == k and e >= lo and s <= ls)]

    def get(self, k, s, e):
        if e <= self.clock - self.retention:
            return None
        return self.rows.get((k, s, e))


def script_topology(retention):
    b = StreamsBuilder()
    b.add_state_store(Stores.session("s", retention, key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.stream("in").process(SessionScript, stores=["s"]).to("out")
    return b.build()


def script_ops(seed, retention, n=700, step=4_000):
    rnd = random.Random(seed)
    keys = ["a", "ab", "b", "k\x00", "k"]
    ops, t, made = [], 0, []
    for i in range(n):
        t = max(0, t + rnd.choice([0, step, step, 3 * step, -step]))
        k = rnd.choice(keys)
        r = rnd.random()
        if r < 0.45:
            end = max(0, t - rnd.choice([0, 0, 2_000, retention - 1, retention, retention + 3]))
            start = max(0, end - rnd.choice([0, 1_000, 15_000]))
            made.append((k, start, end))
            ops.append((k, {"op": "put", "start": start, "end": end, "v": i if rnd.random() < 0.9 else None}, t))
        elif r < 0.55 and made:
            k, start, end = rnd.choice(made[-20:])
            ops.append((k, {"op": "remove", "start": start, "end": end}, t))
        elif r < 0.62 and made:
            k, start, end = rnd.choice(made[-20:])
            ops.append((k, {"op": "get", "start": start, "end": end}, t))
        else:
            op = rnd.choice(["find", "bfind", "fetch", "bfetch"])
            ops.append((k, {"op": op, "ee": t - rnd.choice([0, 10_000, retention, 2 * retention]),
                            "ls": t - rnd.choice([0, 5_000, -5_000, 40_000])}, t))
    return ops


def model_outputs(ops, retention):
    m = SessionModel(retention)
    want = []
    for k, a, _ in ops:
        op = a["op"]
        if op == "put":
            m.put(k, a["start"], a["end"], a["v"])
        elif op == "remove":
            m.remove(k, a["start"], a["end"])
        elif op == "get":
            want.append((k, m.get(k, a["start"], a["end"])))
        elif op in ("find", "bfind"):
            got = m.find(k, a["ee"], a["ls"])
            want.append((k, got if op == "find" else got[::-1]))
        else:
            got = m.find(k, 0, papi_window_key.MAX_TS)
            want.append((k, got if op == "fetch" else got[::-1]))
    return want, m


def test_session_store_reads_follow_the_model():
    retention = 150_000
    ops = script_ops(21, retention)
    want, model = model_outputs(ops, retention)
    with TopologyTestDriver(script_topology(retention)) as d:
        for k, v, ts in ops:
            d.pipe_input("in", k, v, timestamp=ts)
        got = [(r.key, r.value) for r in d.read_output("out")]
        store = d.get_store("s")
        raw = store.raw()
        observed = store.observed_stream_time
        everything = store.all()
    assert got == want
    assert sum(1 for _, v in want if isinstance(v, list) and len(v) > 2) > 30
    assert sum(1 for k, a, _ in ops if a["op"] == "get") > 20
    assert observed == model.clock
    interval = papi_window_key.segment_interval(retention)
    min_live = (model.clock - retention) // interval
    kept = sorted(((k, s, e), v) for (k, s, e), v in model.rows.items() if e // interval >= min_live)
    assert sorted(((w.key, w.start, w.end), v) for w, v in raw) == kept
    assert len(model.rows) > 10 * len(kept) > 50      # whole segments purged
    live = sorted((k.encode(), e, s, v, k) for (k, s, e), v in model.rows.items()
                  if e > model.clock - retention)
    assert [(w.key, w.start, w.end, v) for w, v in everything] == [(k, s, e, v) for _, e, s, v, k in live]


def test_find_sessions_bounds_are_inclusive_and_remove_moves_the_clock():
    with TopologyTestDriver(script_topology(100)) as d:
        for i, (s, e, v) in enumerate([(0, 10, "a"), (20, 30, "b"), (25, 25, "c"), (40, 60, "d")]):
            d.pipe_input("in", "k", {"op": "put", "start": s, "end": e, "v": v}, timestamp=i)
        d.pipe_input("in", "k", {"op": "find", "ee": 25, "ls": 40}, timestamp=5)
        d.pipe_input("in", "k", {"op": "find", "ee": 10, "ls": 20}, timestamp=5)
        d.pipe_input("in", "k", {"op": "remove", "start": 150, "end": 150}, timestamp=6)   # no such session
        d.pipe_input("in", "k", {"op": "fetch"}, timestamp=7)
        assert [r.value for r in d.read_output("out")] == [
            [["k", 25, 25, "c"], ["k", 20, 30, "b"], ["k", 40, 60, "d"]],
            [["k", 0, 10, "a"], ["k", 20, 30, "b"]],
            [["k", 40, 60, "d"]],          # the remove at 150 expired everything ending at or before 50
        ]
        assert d.get_store("s").observed_stream_time == 150


def test_session_store_settings_and_keys_are_checked():
    with pytest.raises(TopologyError, match="retention_ms is an int >= 0"):
        Stores.session("s", -5)
    with TopologyTestDriver(script_topology(100), on_error="dlq") as d:
        d.pipe_input("in", "k", {"op": "put", "start": 10, "end": 5, "v": 1}, timestamp=1)   # end before start
        dlq = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
        assert len(dlq) == 1
        assert any(b"a session ends at or after its start, not [10, 5]" in (v or b"") for _, v in dlq[0].headers)
        assert d.get_store("s").raw() == []


class Sessionizer(Processor):
    """Session windows by hand on a session store (gap 10): a record merges every session of its
    key within the gap, forwards the merged session's count; what it merged is removed."""

    GAP = 10

    def init(self, context):
        self.ctx = context
        self.s = context.get_state_store("sessions")

    def process(self, record):
        t = record.timestamp
        start, end, n = t, t, 1
        for w, count in self.s.find_sessions(record.key, t - self.GAP, t + self.GAP):
            start, end, n = min(start, w.start), max(end, w.end), n + count
            self.s.remove(w)
        self.s.put(Windowed(record.key, start, end), n)
        self.ctx.forward(record._replace(value=[start, end, n]))


def sessionize_model(records, gap, retention):
    sessions: dict = {}    # key -> list of [start, end, n]
    clock, out = -1, []
    for k, t in records:
        live = [x for x in sessions.get(k, []) if x[1] > clock - retention]
        near = [x for x in live if x[1] >= t - gap and x[0] <= t + gap]
        start = min([t] + [x[0] for x in near])
        end = max([t] + [x[1] for x in near])
        n = 1 + sum(x[2] for x in near)
        sessions[k] = [x for x in sessions.get(k, []) if x not in near]
        clock = max([clock] + [x[1] for x in near])
        clock = max(clock, end)
        if end > clock - retention:
            sessions[k].append([start, end, n])
        out.append((k, [start, end, n]))
    return out


def test_a_sessionizer_on_a_session_store_follows_the_model():
    rnd = random.Random(8)
    records, t = [], 0
    for _ in range(500):
        t = max(0, t + rnd.choice([0, 3, 7, 12, 30, -8, -40]))
        records.append((f"u{rnd.randrange(6)}", t))
    b = StreamsBuilder()
    b.add_state_store(Stores.session("sessions", 60))
    b.stream("clicks").process(Sessionizer, stores=["sessions"]).to("merged")
    with TopologyTestDriver(b.build()) as d:
        for k, ts in records:
            d.pipe_input("clicks", k, {}, timestamp=ts)
        got = [(r.key, r.value) for r in d.read_output("merged")]
    want = sessionize_model(records, 10, 60)
    assert got == want
    assert sum(1 for _, (s, e, n) in want if n > 3) > 10 and sum(1 for _, (s, e, n) in want if n == 1) > 50


class Sessionizer40(Sessionizer):
    """The sessionizer with a gap of 40 (the backfill differential's case ``windowed_stores``)."""

    GAP = 40
