"""The Processor API (issue 29): ``KStream.process(P, stores=[...])`` with ``Stores.key_value``
stores and punctuation on both clocks, in the test driver against plain-Python models of Kafka
Streams' documented semantics; a ``process()`` that raises under each on-error policy."""

import random

import pytest

from processor import Processor, Record, Stores, StreamsBuilder
from processor.errors import ProcessingError, TopologyError, UserFunctionError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


class Dedup(Processor):
    """Forwards a key's first value, with the value doubled; remembers every key seen."""

    def init(self, context):
        self.ctx = context
        self.seen = context.get_state_store("seen")

    def process(self, record):
        if self.seen.get(record.key) is None:
            self.seen.put(record.key, record.value)
            self.ctx.forward(record._replace(value={"x2": record.value["x"] * 2}))


def _records(seed=1, n=300, keys=40):
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys):02d}", {"x": rnd.randrange(100)}, 1000 + i) for i in range(n)]


def dedup_topology():
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.stream("in").process(Dedup, stores=["seen"]).to("out")
    return b.build()


def test_a_processor_with_a_store_follows_the_model_and_its_store_is_a_real_store():
    recs = _records()
    with TopologyTestDriver(dedup_topology()) as d:
        for k, v, ts in recs:
            d.pipe_input("in", k, v, timestamp=ts)
        got = [(r.key, r.value, r.timestamp) for r in d.read_output("out")]
        first: dict = {}
        for k, v, ts in recs:
            first.setdefault(k, (v, ts))
        assert got == [(k, {"x2": v["x"] * 2}, ts) for k, v, ts in recs if first[k] == (v, ts)]
        store = d.get_store("seen")
        assert [store.get(k) for k in sorted(first)] == [first[k][0] for k in sorted(first)]
        # the entry's timestamp is the writing record's
        assert [store.get_with_timestamp(k)[1] for k in sorted(first)] == [first[k][1] for k in sorted(first)]
    desc = dedup_topology().describe()
    assert "KSTREAM-PROCESSOR-0000000001 (stores: [seen])" in desc
    assert "seen (kv; owner: KSTREAM-PROCESSOR-0000000001; changelog: <application-id>-seen-changelog)" in desc


class Scanner(Processor):
    """Puts, deletes and scans a store; forwards what range/prefix_scan/all return."""

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("s")

    def process(self, record):
        op, arg = record.value["op"], record.value["arg"]
        if op == "put":
            self.store.put(record.key, arg)
        elif op == "delete":
            self.ctx.forward(record._replace(value={"deleted": self.store.delete(record.key)}))
        elif op == "range":
            self.ctx.forward(record._replace(value=[list(kv) for kv in self.store.range(arg[0], arg[1])]))
        elif op == "prefix":
            self.ctx.forward(record._replace(value=[list(kv) for kv in self.store.prefix_scan(arg)]))
        else:
            self.ctx.forward(record._replace(value=[list(kv) for kv in self.store.all()]))


def test_store_reads_follow_the_model_range_inclusive_prefix_scan_and_all():
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("s"))
    b.stream("in").process(lambda: Scanner(), stores="s").to("out")
    rnd = random.Random(5)
    model: dict = {}
    ops, want = [], []
    for i in range(400):
        k = f"{rnd.choice('ab')}{rnd.randrange(30):02d}"
        r = rnd.random()
        if r < 0.55:
            ops.append((k, {"op": "put", "arg": i}))
            model[k] = i
        elif r < 0.7:
            ops.append((k, {"op": "delete", "arg": None}))
            want.append((k, {"deleted": model.pop(k, None)}))
        elif r < 0.8:
            lo, hi = sorted([f"a{rnd.randrange(30):02d}", f"b{rnd.randrange(30):02d}"])
            ops.append((k, {"op": "range", "arg": [lo, hi]}))
            want.append((k, [[x, model[x]] for x in sorted(model) if lo <= x <= hi]))
        elif r < 0.9:
            p = f"{rnd.choice('ab')}{rnd.randrange(3)}"
            ops.append((k, {"op": "prefix", "arg": p}))
            want.append((k, [[x, model[x]] for x in sorted(model) if x.startswith(p)]))
        else:
            ops.append((k, {"op": "all", "arg": None}))
            want.append((k, [[x, model[x]] for x in sorted(model)]))
    with TopologyTestDriver(b.build()) as d:
        for i, (k, v) in enumerate(ops):
            d.pipe_input("in", k, v, timestamp=i)
        got = [(r.key, r.value) for r in d.read_output("out")]
    assert got == want
    assert any(len(v) > 3 for _, v in want if isinstance(v, list))   # scans that saw something


class Ticker(Processor):
    """Counts records in a store; a stream-time punctuation every 10 ms forwards the count."""

    def __init__(self, clock="stream", interval=10):
        self.clock, self.interval = clock, interval

    def init(self, context):
        self.ctx = context
        self.store = context.get_state_store("n")
        context.schedule(self.interval, self.clock, self.tick)

    def tick(self, ts):
        self.ctx.forward(Record("count", self.store.get("n") or 0, ts))

    def process(self, record):
        self.store.put("n", (self.store.get("n") or 0) + 1)


def _ticker_topology(clock="stream"):
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream("in").process(lambda: Ticker(clock), stores=["n"]).to("ticks")
    return b.build()


def stream_punctuations(timestamps, interval):
    """Kafka Streams' PunctuationSchedule on stream time: aligned to 0, fired at most once per
    advance of stream time; the next time skips the intervals that were missed."""
    out, nxt, stream_time, count = [], 0, -1, 0
    for ts in timestamps:
        count += 1
        if ts > stream_time:
            stream_time = ts
            if stream_time >= nxt:
                out.append((stream_time, count))
                n2 = nxt + interval
                nxt = n2 if stream_time < n2 else nxt + ((stream_time - nxt) // interval + 1) * interval
    return out


def test_stream_time_punctuation_follows_kafka_streams_schedule():
    rnd = random.Random(7)
    ts, t = [], 1
    for _ in range(200):   # mostly forward, with jumps over several intervals and late records
        t += rnd.choice([0, 1, 2, 3, 25, -4])
        ts.append(max(t, 0))
    with TopologyTestDriver(_ticker_topology()) as d:
        for i, x in enumerate(ts):
            d.pipe_input("in", f"k{i % 3}", {"i": i}, timestamp=x)
        got = [(r.timestamp, r.value) for r in d.read_output("ticks")]
    want = stream_punctuations(ts, 10)
    assert got == want
    assert len(want) > 20
    assert stream_punctuations(list(range(1, 61)), 10) == [(1, 1), (10, 10), (20, 20), (30, 30), (40, 40),
                                                          (50, 50), (60, 60)]


def test_stream_time_is_the_tasks_records_a_filter_drops_advance_it_too():
    """Kafka Streams punctuates on the task's stream time (every input record of the task), not
    on the records that reach the processor: a filtered-out record at 50 fires the punctuation at
    50. The model: the schedule over every input timestamp, each tick forwarding the count of the
    records that passed the filter so far (the whole record is processed before it punctuates)."""
    rnd = random.Random(3)
    ts, t = [], 0
    for _ in range(300):
        t += rnd.choice([0, 1, 2, 7, 31, -5])
        ts.append(max(t, 0))
    keep = [rnd.random() < 0.3 for _ in ts]
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream("in").filter(lambda k, v: v["keep"]).process(Ticker, stores=["n"]).to("ticks")
    with TopologyTestDriver(b.build()) as d:
        for i, (x, k) in enumerate(zip(ts, keep, strict=False)):
            d.pipe_input("in", f"k{i % 3}", {"keep": k}, timestamp=x)
        got = [(r.timestamp, r.value) for r in d.read_output("ticks")]
    want = [(at, sum(keep[:n])) for at, n in stream_punctuations(ts, 10)]
    assert got == want
    assert len(want) > 50 and sum(keep) < len(ts) / 2


def test_wall_clock_punctuation_fires_every_interval_of_the_drivers_clock():
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream("in").process(lambda: Ticker("wall", 100), stores=["n"]).to("ticks")
    with TopologyTestDriver(b.build(), initial_wall_clock_ms=1000) as d:
        d.pipe_input("in", "a", {}, timestamp=5)
        d.advance_wall_clock(50)     # 1050: not yet (first at 1100)
        d.advance_wall_clock(60)     # 1110
        d.pipe_input("in", "b", {}, timestamp=6)
        d.advance_wall_clock(350)    # 1460: once, the missed intervals skipped; next at 1500
        d.advance_wall_clock(40)     # 1500
        got = [(r.timestamp, r.value) for r in d.read_output("ticks")]
    assert got == [(1110, 1), (1460, 2), (1500, 2)]


@pytest.mark.parametrize("policy", ["dlq", "skip", "fail"])
def test_a_process_that_raises_follows_the_on_error_policy_and_leaves_no_write(policy):
    class Picky(Processor):
        def init(self, context):
            self.ctx, self.store = context, context.get_state_store("s")

        def process(self, record):
            self.store.put(record.key, record.value)       # written, then undone when it raises
            if record.value["x"] == 13:
                raise ValueError("unlucky")
            self.ctx.forward(record)

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("s"))
    b.stream("in").process(Picky, stores=["s"]).to("out")
    recs = [("a", {"x": 1}), ("b", {"x": 13}), ("c", {"x": 2})]
    with TopologyTestDriver(b.build(), on_error=policy) as d:
        if policy == "fail":
            with pytest.raises(UserFunctionError, match="unlucky"):
                for i, (k, v) in enumerate(recs):
                    d.pipe_input("in", k, v, timestamp=i)
            return
        for i, (k, v) in enumerate(recs):
            d.pipe_input("in", k, v, timestamp=i)
        assert [r.key for r in d.read_output("out")] == ["a", "c"]
        assert d.get_store("s").get("b") is None and d.get_store("s").get("c") == {"x": 2}
        dead = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
    if policy == "dlq":
        assert [r.key for r in dead] == [b"b"]
        assert "unlucky" in dict(dead[0].headers)["__streams.errors.message"].decode()
    else:
        assert dead == []


def test_stores_must_be_added_and_connected():
    b = StreamsBuilder()
    with pytest.raises(TopologyError, match="no store 'nope' was added"):
        b.stream("in").process(Dedup, stores=["nope"])
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen"))
    b.stream("in").filter(lambda k, v: True)
    with pytest.raises(TopologyError, match="connected to no processor"):
        b.build()


def test_a_key_change_in_process_repartitions_a_later_group_by_key():
    class Rekey(Processor):
        def init(self, context):
            self.ctx = context

        def process(self, record):
            self.ctx.forward(record._replace(key=record.key[:2]))

    b = StreamsBuilder()
    b.stream("in").process(Rekey).group_by_key().count(name="c")
    assert "-repartition" in b.build().describe()


def test_a_failed_record_neither_restarts_nor_repeats_the_stream_schedule():
    """Found in review: the operators are rebuilt after a failed record; the schedule goes on
    from its kept next time (interval 100: records at 0, 10, 20 (fails), 30 punctuate at 0 only)."""
    class FailingTicker(Ticker):
        def __init__(self):
            super().__init__("stream", 100)

        def process(self, record):
            if record.value.get("fail"):
                raise ValueError("bad record")
            super().process(record)

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream("in").process(FailingTicker, stores=["n"]).to("ticks")
    with TopologyTestDriver(b.build(), on_error="skip") as d:
        for ts, v in ((0, {}), (10, {}), (20, {"fail": True}), (30, {})):
            d.pipe_input("in", "k", v, timestamp=ts)
        assert [(r.timestamp, r.value) for r in d.read_output("ticks")] == [(0, 1)]
        d.pipe_input("in", "k", {}, timestamp=100)
        assert [(r.timestamp, r.value) for r in d.read_output("ticks")] == [(100, 4)]


def test_a_punctuation_that_raises_is_fatal_not_the_records_fault():
    class Boom(Processor):
        def init(self, context):
            context.schedule(10, "stream", self.tick)

        def tick(self, ts):
            raise RuntimeError("tick failed")

        def process(self, record):
            pass

    b = StreamsBuilder()
    b.stream("in").process(Boom).to("out")
    with TopologyTestDriver(b.build(), on_error="dlq") as d:
        with pytest.raises(ProcessingError, match="stream-time punctuation .*tick failed") as info:
            d.pipe_input("in", "k", {}, timestamp=0)
        assert not isinstance(info.value, UserFunctionError)
        assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []


def test_failed_records_neither_restart_a_wall_schedule_nor_revive_a_cancelled_one():
    """Found in review: a failed record rebuilds the operators (a new instance, init again). A
    wall schedule goes on from its kept next time (a record failing every 60 ms used to push an
    interval of 100 ms away for ever), and a cancelled schedule stays cancelled."""
    class Flaky(Processor):
        def init(self, context):
            self.ctx = context
            self.wall = context.schedule(100, "wall", self.tick)
            self.stream = context.schedule(10, "stream", self.stream_tick)

        def tick(self, now):
            self.ctx.forward(Record("wall", now, now))

        def stream_tick(self, ts):
            self.ctx.forward(Record("stream", ts, ts))

        def process(self, record):
            if record.value.get("cancel"):
                self.wall.cancel()
                self.stream.cancel()
            if record.value.get("fail"):
                raise ValueError("bad record")

    b = StreamsBuilder()
    b.stream("in").process(Flaky).to("ticks")
    with TopologyTestDriver(b.build(), on_error="skip", initial_wall_clock_ms=1000) as d:
        for i in range(10):           # wall 1000 .. 1600: a failing record every 60 ms
            d.pipe_input("in", "k", {"fail": True}, timestamp=i)
            d.advance_wall_clock(60)
        d.pipe_input("in", "k", {}, timestamp=20)
        assert [(r.key, r.value) for r in d.read_output("ticks")] == [
            ("wall", 1120), ("wall", 1240), ("wall", 1300), ("wall", 1420), ("wall", 1540),
            ("wall", 1600), ("stream", 20)]
        d.pipe_input("in", "k", {"cancel": True}, timestamp=21)
        d.pipe_input("in", "k", {"fail": True}, timestamp=40)    # rebuilt: init schedules again
        d.advance_wall_clock(500)
        d.pipe_input("in", "k", {}, timestamp=50)
        assert d.read_output("ticks") == []


def test_a_factory_must_make_a_new_instance_per_task():
    """Kafka Streams refuses a ProcessorSupplier that returns the same instance twice: two tasks
    would share one processor's fields. A class, or a factory making new instances, is fine."""
    shared = Dedup()
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen"))
    b.stream("in").process(lambda: shared, stores=["seen"]).to("out")
    with TopologyTestDriver(b.build()):   # (the driver runs one task per sub-topology: two drivers)
        with pytest.raises(TopologyError, match="another task already uses"):
            TopologyTestDriver(b.build())
    # one task: the instance is used once; closed, it may be used again
    for _ in range(2):
        with TopologyTestDriver(b.build()) as d:
            d.pipe_input("in", "a", {"x": 1}, timestamp=1)
            assert [r.value for r in d.read_output("out")] == [{"x2": 2}]


def test_processors_connected_to_one_store_share_it_and_a_sub_topology():
    """As Kafka Streams: a store connected to two processors (here on two input topics) is one
    store, and the processors share a sub-topology (their topics co-partitioned): a dedup
    across both streams, against the model over the interleaved records."""
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("seen", key_serde=Serdes.string(), value_serde=Serdes.json()))
    b.stream("in").process(Dedup, stores=["seen"]).to("out")
    b.stream("in2").process(Dedup, stores=["seen"]).to("out")
    topo = b.build()
    assert len(topo.subtopologies) == 1
    assert topo.describe().count("(stores: [seen])") == 2
    assert "co-partitioned, one partitioner for in and in2" in topo.describe()
    rnd = random.Random(4)
    recs = [(rnd.choice(["in", "in2"]), f"k{rnd.randrange(30)}", {"x": i}) for i in range(200)]
    with TopologyTestDriver(topo) as d:
        for i, (t, k, v) in enumerate(recs):
            d.pipe_input(t, k, v, timestamp=i)
        got = [(r.key, r.value) for r in d.read_output("out")]
        first = {}
        for _t, k, v in recs:
            first.setdefault(k, v)
        assert got == [(k, {"x2": v["x"] * 2}) for k, v in first.items()]
        assert [d.get_store("seen").get(k) for k in sorted(first)] == [first[k] for k in sorted(first)]


@pytest.mark.parametrize("policy", ["dlq", "skip"])
def test_a_record_that_does_not_deserialize_moves_no_stream_time_and_rebuilds_nothing(policy):
    """Found in review: a poison record at 25 moved the task's stream time, so the record at 20
    after it did not punctuate (and each one rebuilt the operators: a new instance, init again)."""
    inits = []

    class CountingTicker(Ticker):
        def init(self, context):
            inits.append(1)
            super().init(context)

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value("n"))
    b.stream("in").process(CountingTicker, stores=["n"]).to("ticks")
    with TopologyTestDriver(b.build(), on_error=policy) as d:
        d.pipe_input("in", "k", {}, timestamp=5)
        d.pipe_raw("in", b"k", b"{not json", timestamp=25)
        d.pipe_input("in", "k", {}, timestamp=20)
        assert [(r.timestamp, r.value) for r in d.read_output("ticks")] == [(5, 1), (20, 2)]
        assert len(inits) == 1


def test_a_stream_punctuations_output_too_large_is_fatal_not_the_records():
    class Huge(Processor):
        def init(self, context):
            self.ctx = context
            context.schedule(10, "stream", lambda ts: self.ctx.forward(Record("big", "x" * 2_000_000, ts)))

        def process(self, record):
            pass

    b = StreamsBuilder()
    b.stream("in").process(Huge).to("out")
    with TopologyTestDriver(b.build(), on_error="dlq") as d:
        with pytest.raises(ProcessingError, match="stream-time punctuation's output") as info:
            d.pipe_input("in", "k", {}, timestamp=0)
        assert not isinstance(info.value, UserFunctionError)
        assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []
