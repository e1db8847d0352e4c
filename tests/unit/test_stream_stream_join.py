"""Stream-stream windowed joins in the driver: exact output sequences (key, value, timestamp),
a from-scratch reference model, purging, and the KIP-862 self-join rewrite (optimized vs
unoptimized, differential)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import JoinWindows, StreamsBuilder, TimeWindows
from processor.errors import TopologyError
from processor.operators import stream_join as ops
from processor.testing import TopologyTestDriver

THIS, OTHER = "KSTREAM-JOINTHIS-0000000002", "KSTREAM-JOINOTHER-0000000003"
BASE = "KSTREAM-JOIN-0000000002"


def pair(left, right):
    return [left, right]


TEN_MS = JoinWindows.of(10)


def two_streams(how="join", windows=TEN_MS, optimize=True):
    b = StreamsBuilder()
    left, right = b.stream("left"), b.stream("right")
    getattr(left, how)(right, pair, windows).to("out")
    return b.build(optimize=optimize)


def out(driver):
    return [(r.key, r.value, r.timestamp) for r in driver.read_output("out")]


def pipe_all(topology, records):
    """``records``: ``(topic, key, value, ts)``; the whole output sequence."""
    with TopologyTestDriver(topology) as d:
        for topic, k, v, ts in records:
            d.pipe_input(topic, k, v, timestamp=ts)
        return out(d)


# -- inner joins ------------------------------------------------------------------------------------
def test_inner_join_exact_sequence_with_out_of_order_expired_and_duplicate_records():
    # retention 10 + 10 + 5 = 25: a record is in its store's live range while t > observed - 25
    with TopologyTestDriver(two_streams(windows=JoinWindows.of(10).grace(5))) as d:
        d.pipe_input("left", "a", "a1", timestamp=100)
        assert out(d) == []
        d.pipe_input("right", "a", "r1", timestamp=105)
        assert out(d) == [("a", ["a1", "r1"], 105)]
        d.pipe_input("right", "a", "r2", timestamp=95)     # out of order, within grace
        assert out(d) == [("a", ["a1", "r2"], 100)]
        d.pipe_input("left", "a", "a2", timestamp=112)
        assert out(d) == [("a", ["a2", "r1"], 112)]
        d.pipe_input("left", "a", "a3", timestamp=96)      # 112 > 96 + 10 + 5, yet never dropped
        assert out(d) == [("a", ["a3", "r2"], 96), ("a", ["a3", "r1"], 105)]
        d.pipe_input("left", "a", "a4", timestamp=97)
        assert out(d) == [("a", ["a4", "r2"], 97), ("a", ["a4", "r1"], 105)]
        d.pipe_input("right", "b", "x", timestamp=112)     # another key
        assert out(d) == []
        d.pipe_input("right", "a", "r3", timestamp=105)    # matches in timestamp order
        assert out(d) == [("a", ["a3", "r3"], 105), ("a", ["a4", "r3"], 105), ("a", ["a1", "r3"], 105),
                          ("a", ["a2", "r3"], 112)]
        d.pipe_input("left", "a", "a5", timestamp=105)     # duplicates of (a, 105) in arrival order
        assert out(d) == [("a", ["a5", "r2"], 105), ("a", ["a5", "r1"], 105), ("a", ["a5", "r3"], 105)]
        d.pipe_input("left", "a", "a6", timestamp=87)      # 87 <= 112 - 25: not stored, still joins
        assert out(d) == [("a", ["a6", "r2"], 95)]
        d.pipe_input("right", "a", "r4", timestamp=90)     # sees a3, a4, a1, not a6
        assert out(d) == [("a", ["a3", "r4"], 96), ("a", ["a4", "r4"], 97), ("a", ["a1", "r4"], 100)]
        d.pipe_input("left", None, "n", timestamp=110)
        m = d.metrics()
        assert m[THIS]["expired_not_stored"] == 1 and m[OTHER]["expired_not_stored"] == 0
        assert m[THIS]["skipped_null_key"] == 1
        assert m[THIS]["joined"] + m[OTHER]["joined"] == 18
        assert [(k, ts) for (k, ts, _), _ in d.get_store(f"{BASE}-this-store").items()] == \
            [("a", 96), ("a", 97), ("a", 100), ("a", 105), ("a", 112)]


def test_inner_join_with_before_and_after_windows():
    # a left record at t matches right records in [t - 5, t + 20]; a right one left records in
    # [t - 20, t + 5]; retention 5 + 20 + 0 = 25, by each store's own observed time
    with TopologyTestDriver(two_streams(windows=JoinWindows(5, 20, 0))) as d:
        d.pipe_input("left", "k", "l1", timestamp=100)
        d.pipe_input("right", "k", "r1", timestamp=94)     # l1 at 100 is after 94 + 5
        d.pipe_input("right", "k", "r2", timestamp=96)
        d.pipe_input("right", "k", "r3", timestamp=118)
        d.pipe_input("right", "k", "r4", timestamp=121)    # l1 at 100 is before 121 - 20
        assert out(d) == [("k", ["l1", "r2"], 100), ("k", ["l1", "r3"], 118)]
        d.pipe_input("left", "k", "l2", timestamp=101)     # r2 at 96 <= 121 - 25: out of the right store's range
        assert out(d) == [("k", ["l2", "r3"], 118), ("k", ["l2", "r4"], 121)]
        d.pipe_input("left", "k", "l3", timestamp=100)     # out of order: joins what the right store holds
        assert out(d) == [("k", ["l3", "r3"], 118)]
        d.pipe_input("right", "k", "r5", timestamp=95)     # 95 <= 121 - 25: not stored, joins l1 and l3
        assert out(d) == [("k", ["l1", "r5"], 100), ("k", ["l3", "r5"], 100)]
        d.pipe_input("left", "k", "l4", timestamp=99)      # r5 was not stored
        assert out(d) == [("k", ["l4", "r3"], 118)]
        m = d.metrics()
        assert (m[THIS]["expired_not_stored"], m[OTHER]["expired_not_stored"]) == (0, 1)


def test_join_topology_shape_and_errors():
    topo = two_streams()
    assert len(topo.subtopologies) == 1          # both inputs co-partitioned in one task
    d = topo.describe()
    assert f"Processor: {THIS} (stores: [{BASE}-this-store, {BASE}-other-store])" in d
    assert f"Processor: {OTHER} (stores: [{BASE}-other-store, {BASE}-this-store])" in d
    assert "KSTREAM-MERGE-0000000004" in d
    assert f"{BASE}-outer-store (join-outer" in two_streams("left_join").describe()
    b = StreamsBuilder()
    b.stream("l").left_join(b.stream("r"), pair, JoinWindows.of(1), name="pairs").to("out")
    d = b.build().describe()
    for part in ("Processor: pairs-join-this (stores: [pairs-this-store, pairs-other-store, pairs-outer-store])",
                 "Processor: pairs-join-other", "Processor: pairs-join-merge"):
        assert part in d
    b = StreamsBuilder()
    s = b.stream("s")
    with pytest.raises(TopologyError, match="JoinWindows"):
        s.join(b.stream("u"), pair)
    with pytest.raises(TopologyError, match="JoinWindows"):
        s.join(b.stream("v"), pair, TimeWindows.of(10))
    with pytest.raises(TopologyError, match="one StreamsBuilder"):
        s.join(StreamsBuilder().stream("w"), pair, JoinWindows.of(1))


# -- left and outer joins ---------------------------------------------------------------------------
def test_left_join_emits_unmatched_left_records_when_their_window_closes():
    with TopologyTestDriver(two_streams("left_join", JoinWindows.of(10))) as d:
        d.pipe_input("left", "a", "a1", timestamp=0)
        d.pipe_input("left", "b", "b1", timestamp=5)
        assert out(d) == []
        d.pipe_input("right", "a", "r1", timestamp=8)      # a1 matched: never emitted unmatched
        assert out(d) == [("a", ["a1", "r1"], 8)]
        d.pipe_input("right", "c", "c1", timestamp=9)      # right records are not kept unmatched
        assert out(d) == []
        d.pipe_input("left", "a", "a2", timestamp=20)      # closes b1 (5 + 10 < 20)
        assert out(d) == [("b", ["b1", None], 5)]
        d.pipe_input("left", "a", "a3", timestamp=11)      # out of order, matched at once
        assert out(d) == [("a", ["a3", "r1"], 11)]
        d.pipe_input("left", "d", "d1", timestamp=12)
        d.pipe_input("left", "d", "d2", timestamp=12)
        assert out(d) == []
        d.pipe_input("right", "a", "r2", timestamp=25)     # closes d1, d2 (in arrival order); matches a2
        assert out(d) == [("d", ["d1", None], 12), ("d", ["d2", None], 12), ("a", ["a2", "r2"], 25)]
        d.pipe_input("left", "e", "e1", timestamp=40)
        assert out(d) == []
        m = d.metrics()     # emitted by whichever side advanced stream time
        assert (m[THIS]["unmatched_emitted"], m[OTHER]["unmatched_emitted"]) == (1, 2)
    assert out(d) == []      # e1's window never closed: unmatched records are state, not flushed


def test_outer_join_emits_unmatched_records_of_both_sides():
    with TopologyTestDriver(two_streams("outer_join", JoinWindows.of(10).grace(2))) as d:
        d.pipe_input("left", "a", "a1", timestamp=10)
        d.pipe_input("right", "b", "b1", timestamp=12)
        d.pipe_input("right", "a", "r1", timestamp=15)
        assert out(d) == [("a", ["a1", "r1"], 15)]
        d.pipe_input("left", "c", "c1", timestamp=20)
        d.pipe_input("right", "c", "c2", timestamp=31)     # closes b1 (12 + 10 + 2 < 31), c1 still open
        assert out(d) == [("b", [None, "b1"], 12)]
        d.pipe_input("left", "c", "c3", timestamp=25)      # matches the unmatched c2: c2 leaves the outer store
        assert out(d) == [("c", ["c3", "c2"], 31)]
        d.pipe_input("left", "d", "d1", timestamp=50)
        assert out(d) == [("c", ["c1", None], 20)]
        d.pipe_input("left", "x", "x1", timestamp=60)
        d.pipe_input("right", "y", "y1", timestamp=60)
        d.pipe_input("left", "z", "z1", timestamp=100)     # Kafka Streams' order: timestamp, right before left, key
        assert out(d) == [("d", ["d1", None], 50), ("y", [None, "y1"], 60), ("x", ["x1", None], 60)]
        assert d.get_store(f"{BASE}-outer-store").items() == [((100, "left", 5, "z"), "z1")]
        assert d.metrics()[OTHER]["unmatched_emitted"] + d.metrics()[THIS]["unmatched_emitted"] == 5


def test_unmatched_records_are_emitted_only_once_stream_time_passes_their_window_close():
    # before 2, after 6, grace 1: a left record closes at t + 6 + 1, a right one at t + 2 + 1
    with TopologyTestDriver(two_streams("outer_join", JoinWindows(2, 6, 1))) as d:
        d.pipe_input("left", "l", "l1", timestamp=10)
        d.pipe_input("right", "r", "r1", timestamp=12)
        d.pipe_input("left", "x", "x1", timestamp=15)      # 12 + 3 == 15: r1 still open
        assert out(d) == []
        d.pipe_input("left", "x", "x2", timestamp=16)      # r1 closed, l1 (closes at 17) not yet
        assert out(d) == [("r", [None, "r1"], 12)]
        d.pipe_input("right", "y", "y1", timestamp=17)
        assert out(d) == []
        d.pipe_input("right", "y", "y2", timestamp=18)
        assert out(d) == [("l", ["l1", None], 10)]


# -- a from-scratch reference model -------------------------------------------------------------------
def reference(records, how, w):
    """The join's output computed from the module docstring's rules (Kafka Streams'), without
    stores or purging."""
    stream_time, out_, stored, pending = -1, [], {"left": [], "right": []}, []
    observed, seqs = {"left": -1, "right": -1}, {"left": 0, "right": 0}
    retention = w.before_ms + w.after_ms + w.grace_ms
    close = {"left": w.after_ms + w.grace_ms, "right": w.before_ms + w.grace_ms}
    tracked = {"inner": (), "left": ("left",), "outer": ("left", "right")}[how]
    for topic, k, v, t in records:
        if t < 0:
            continue
        stream_time = max(stream_time, t)     # every record advances it, as Kafka Streams' time tracker
        if k is None and v is not None and topic in tracked:   # KIP-962: unmatched at once
            out_.append((k, [v, None] if topic == "left" else [None, v], t))
            continue
        if k is None or v is None:
            continue
        if t == stream_time:
            # Kafka Streams' outer store order: timestamp, right before left, key, arrival
            closed = sorted((p for p in pending if p[0] + close[p[1]] < stream_time),
                            key=lambda p: (p[0], p[1] == "left", p[3], p[2]))
            for p in closed:
                pending.remove(p)
                out_.append((p[3], [p[4], None] if p[1] == "left" else [None, p[4]], p[0]))
        other = "right" if topic == "left" else "left"
        back, ahead = (w.before_ms, w.after_ms) if topic == "left" else (w.after_ms, w.before_ms)
        seq, seqs[topic] = seqs[topic], seqs[topic] + 1
        observed[topic] = max(observed[topic], t)
        if t > observed[topic] - retention:                     # in its own store's live range
            stored[topic].append((k, t, seq, v))
        live_from = observed[other] - retention + 1
        matches = sorted((x for x in stored[other] if x[0] == k and max(t - back, live_from) <= x[1] <= t + ahead),
                         key=lambda x: (x[1], x[2]))
        for _xk, xt, xseq, xv in matches:
            pending[:] = [p for p in pending if p[1:3] != (other, xseq)]
            out_.append((k, [v, xv] if topic == "left" else [xv, v], max(t, xt)))
        if not matches and topic in tracked:
            if t + ahead < stream_time:                         # its window has ended: at once
                out_.append((k, [v, None] if topic == "left" else [None, v], t))
            else:
                pending.append((t, topic, seq, k, v))
    return out_


record_lists = st.lists(st.tuples(st.sampled_from(["left", "right"]), st.sampled_from(["a", "b", None]),
                                  st.one_of(st.integers(0, 999), st.none()), st.integers(-1, 50)),
                        max_size=40)
join_windows = st.builds(JoinWindows, st.integers(0, 12), st.integers(0, 12), st.integers(0, 8))


@settings(max_examples=150, deadline=None)
@given(records=record_lists, how=st.sampled_from(["join", "left_join", "outer_join"]), w=join_windows)
def test_join_output_equals_the_reference_model(records, how, w):
    kind = {"join": "inner", "left_join": "left", "outer_join": "outer"}[how]
    assert pipe_all(two_streams(how, w), records) == reference(records, kind, w)


@settings(max_examples=60, deadline=None)
@given(records=record_lists, how=st.sampled_from(["join", "left_join", "outer_join"]), w=join_windows)
def test_purging_never_changes_the_output(records, how, w):
    with_purge = pipe_all(two_streams(how, w), records)
    original = ops._StreamJoin._purge
    ops._StreamJoin._purge = lambda self, stream_time, stores: None
    try:
        without = pipe_all(two_streams(how, w), records)
    finally:
        ops._StreamJoin._purge = original
    assert with_purge == without


def test_purging_bounds_the_window_stores():
    with TopologyTestDriver(two_streams(windows=JoinWindows.of(5))) as d:
        for i in range(100):
            d.pipe_input("left", "k", i, timestamp=i * 10)
            d.pipe_input("right", "k", i, timestamp=i * 10 + 3)
        assert len(out(d)) == 100
        assert len(d.get_store(f"{BASE}-this-store")) <= 2
        assert len(d.get_store(f"{BASE}-other-store")) <= 2


# -- the self-join rewrite (KIP-862) ----------------------------------------------------------------
def self_join(optimize=True, two_sources=False, how="join", windows=TEN_MS):
    b = StreamsBuilder()
    s = b.stream("t")
    getattr(s, how)(b.stream("t") if two_sources else s, pair, windows).to("out")
    return b.build(optimize=optimize)


def stores_in(description):
    return sorted(set(re.findall(r"[\w-]+-store\b(?!-)", description)))


@pytest.mark.parametrize("two_sources", [False, True])
def test_self_join_uses_one_store_when_optimized(two_sources):
    opt = self_join(two_sources=two_sources).describe()
    assert "self-join: 1 rewrite(s)" in opt
    assert len(stores_in(opt)) == 1 and stores_in(opt)[0].endswith("-this-store")
    assert "JOINOTHER" not in opt and opt.count("Source:") == 1
    plain = self_join(optimize=False, two_sources=two_sources).describe()
    assert len(stores_in(plain)) == 2 and "JOINOTHER" in plain


@pytest.mark.parametrize("two_sources", [False, True])
def test_self_join_exact_sequence_optimized_and_not(two_sources):
    # retention 20: "old" at 4 is in the store's live range (4 > 15 - 20); v5 at 10 is not (10 <= 30 - 20)
    records = [("t", "a", "v1", 10), ("t", "a", "v2", 15), ("t", "b", "w", 15), ("t", "a", "v3", 5),
               ("t", "a", "old", 4), ("t", "a", "v4", 30), ("t", "a", "v5", 10)]
    expected = [("a", ["v1", "v1"], 10),
                ("a", ["v2", "v1"], 15), ("a", ["v1", "v2"], 15), ("a", ["v2", "v2"], 15),
                ("b", ["w", "w"], 15),
                ("a", ["v3", "v1"], 10), ("a", ["v3", "v2"], 15),                            # pass 1
                ("a", ["v3", "v3"], 5), ("a", ["v1", "v3"], 10), ("a", ["v2", "v3"], 15),    # pass 2
                ("a", ["old", "v3"], 5), ("a", ["old", "v1"], 10),
                ("a", ["old", "old"], 4), ("a", ["v3", "old"], 5), ("a", ["v1", "old"], 10),
                ("a", ["v4", "v4"], 30),
                # v5: not stored (no (v5, v5)); of [0, 20] only v2 at 15 is still in the live range
                ("a", ["v5", "v2"], 15), ("a", ["v2", "v5"], 15)]
    for optimize in (True, False):
        assert pipe_all(self_join(optimize, two_sources), records) == expected


@pytest.mark.parametrize("how", ["left_join", "outer_join"])
def test_left_and_outer_self_joins_are_not_rewritten(how):
    d = self_join(how=how).describe()
    assert "self-join: 0 rewrite(s)" in d and "JOINOTHER" in d
    assert [s for s in stores_in(d) if not s.endswith("-outer-store")] == [
        "KSTREAM-JOIN-0000000001-other-store", "KSTREAM-JOIN-0000000001-this-store"]


def test_self_join_with_before_not_after_is_not_rewritten():
    d = self_join(windows=JoinWindows(3, 7, 0)).describe()
    assert "self-join: 0 rewrite(s)" in d and len(stores_in(d)) == 2


self_join_records = st.lists(st.tuples(st.just("t"), st.sampled_from(["a", "b", "c", None]),
                                       st.one_of(st.integers(0, 999), st.none()), st.integers(-1, 80)),
                             max_size=40)


@settings(max_examples=150, deadline=None)
@given(records=self_join_records, two_sources=st.booleans(), data=st.data(),
       before=st.integers(0, 12), grace=st.integers(0, 8))
def test_self_join_optimized_output_equals_unoptimized(records, two_sources, data, before, grace):
    # mostly before == after (rewritten); sometimes not (not rewritten: both forms unoptimized)
    after = data.draw(st.one_of(st.just(before), st.just(before), st.integers(0, 12)), label="after")
    w = JoinWindows(before, after, grace)
    optimized = self_join(True, two_sources, windows=w)
    assert optimized.applied_passes == [("self-join", 1 if before == after else 0)]
    assert pipe_all(optimized, records) == pipe_all(self_join(False, two_sources, windows=w), records)


@settings(max_examples=100, deadline=None)
@given(records=self_join_records, window=st.integers(0, 12), grace=st.integers(0, 8),
       how=st.sampled_from(["left_join", "outer_join"]))
def test_left_and_outer_self_joins_equal_the_model_of_each_record_on_both_sides(records, window, grace, how):
    # unoptimized (not rewritten): each record runs on the left side, then on the right side. A
    # record out of order whose window has ended and that nothing else matches is emitted
    # unmatched at once, before it matches itself on the right side (as Kafka Streams)
    w = JoinWindows(window, window, grace)
    both = [(side, k, v, t) for _, k, v, t in records for side in ("left", "right")]
    assert pipe_all(self_join(False, how=how, windows=w), records) == reference(both, how.split("_")[0], w)


def test_a_left_self_join_emits_an_out_of_order_record_unmatched_then_matched_with_itself():
    records = [("t", "a", "v1", 50), ("t", "b", "x", 10)]
    assert pipe_all(self_join(False, how="left_join", windows=JoinWindows.of(10).grace(100)), records) == [
        ("a", ["v1", "v1"], 50), ("b", ["x", None], 10), ("b", ["x", "x"], 10)]
    assert pipe_all(self_join(False, windows=JoinWindows.of(10).grace(100)), records) == [
        ("a", ["v1", "v1"], 50), ("b", ["x", "x"], 10)]
