"""Primary-key table-table joins and the table self-join rewrite, in the test driver.

Exact output sequences with timestamps; a hypothesis oracle (the change of the from-scratch
join after every record); and the self-join differential: optimized and unoptimized
topologies give identical output sequences, the optimized one with one store fewer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.testing import TopologyTestDriver


def pair(lv, r):
    return [lv, r]


def build(how, optimize=True):
    b = StreamsBuilder()
    left = b.table("left")
    right = b.table("right")
    getattr(left, {"inner": "join", "left": "left_join", "outer": "outer_join"}[how])(
        right, pair).to_stream().to("out")
    return b.build(optimize=optimize)


def out(d):
    return [(r.key, r.value, r.timestamp) for r in d.read_output("out")]


def test_inner_left_outer_exact_sequences():
    steps = [("left", "a", 1, 10), ("right", "a", 2, 5), ("right", "b", 3, 20), ("left", "a", 4, 30),
             ("left", "a", 4, 31), ("right", "a", None, 40), ("left", "b", 5, 50), ("left", "b", None, 60),
             ("right", "b", None, 70)]
    want = {
        "inner": [[], [("a", [1, 2], 10)], [], [("a", [4, 2], 30)], [], [("a", None, 40)], [("b", [5, 3], 50)],
                  [("b", None, 60)], []],
        "left": [[("a", [1, None], 10)], [("a", [1, 2], 10)], [], [("a", [4, 2], 30)], [],
                 [("a", [4, None], 40)], [("b", [5, 3], 50)], [("b", None, 60)], []],
        "outer": [[("a", [1, None], 10)], [("a", [1, 2], 10)], [("b", [None, 3], 20)], [("a", [4, 2], 30)], [],
                  [("a", [4, None], 40)], [("b", [5, 3], 50)], [("b", [None, 3], 60)], [("b", None, 70)]],
    }
    for how, expected in want.items():
        with TopologyTestDriver(build(how)) as d:
            got = []
            for topic, k, v, ts in steps:
                d.pipe_input(topic, k, v, timestamp=ts)
                got.append(out(d))
            assert got == expected, how


def test_result_store_holds_the_joined_table_and_old_values_are_forwarded():
    b = StreamsBuilder()
    left, right = b.table("left"), b.table("right")
    joined = left.join(right, pair, name="lr")
    joined.filter(lambda k, v: v[0] > 1).to_stream().to("out")   # the filter needs old values
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("left", "a", 2, timestamp=1)
        d.pipe_input("right", "a", 0, timestamp=2)
        d.pipe_input("left", "a", 1, timestamp=3)     # passes -> fails: a tombstone downstream
        assert out(d) == [("a", [2, 0], 2), ("a", None, 3)]
        assert d.get_store("lr").items() == [("a", [1, 0])]


def test_join_of_derived_tables_uses_their_parents_stores():
    b = StreamsBuilder()
    left = b.table("left").filter(lambda k, v: v % 2 == 0)
    right = b.table("right").map_values(lambda v: v * 10)
    left.join(right, pair, name="lr").to_stream().to("out")
    t = b.build()
    assert sorted(t.stores) == ["left-STATE-STORE-0000000000", "lr", "right-STATE-STORE-0000000002"]
    with TopologyTestDriver(t) as d:
        d.pipe_input("right", "a", 1, timestamp=1)
        d.pipe_input("left", "a", 3, timestamp=2)     # filtered out: no row
        d.pipe_input("left", "a", 4, timestamp=3)
        d.pipe_input("right", "a", 2, timestamp=4)
        assert out(d) == [("a", [4, 10], 3), ("a", [4, 20], 4)]


updates = st.lists(st.tuples(st.sampled_from(["left", "right"]), st.sampled_from(["a", "b", "c"]),
                             st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 50)), max_size=50)


def from_scratch(left, right, how):
    res = {}
    for k in set(left) | set(right):
        lv, r = left.get(k, (None,))[0], right.get(k, (None,))[0]
        if (how == "inner" and lv is not None and r is not None) or (how == "left" and lv is not None) \
                or (how == "outer" and (lv is not None or r is not None)):
            res[k] = [lv, r]
    return res


@settings(max_examples=150, deadline=None)
@given(ups=updates, how=st.sampled_from(["inner", "left", "outer"]))
def test_every_step_forwards_exactly_the_change_of_the_from_scratch_join(ups, how):
    tables = {"left": {}, "right": {}}
    with TopologyTestDriver(build(how)) as d:
        for topic, k, v, ts in ups:
            before = from_scratch(tables["left"], tables["right"], how)
            t = tables[topic]
            if v is None:
                t.pop(k, None)
            elif t.get(k, (None,))[0] != v:
                t[k] = (v, ts)
            after = from_scratch(tables["left"], tables["right"], how)
            other = tables["right" if topic == "left" else "left"].get(k)
            want = ([] if before.get(k) == after.get(k)
                    else [(k, after.get(k), ts if other is None else max(ts, other[1]))])
            d.pipe_input(topic, k, v, timestamp=ts)
            assert out(d) == want


# -- self-join: the rewrite pass ---------------------------------------------------------------
def self_join(how, optimize, derived=False, named=False):
    b = StreamsBuilder()
    t = b.table("t")
    if derived:
        t = t.filter(lambda k, v: v != 2).map_values(lambda v: v + 100)
    j = getattr(t, {"inner": "join", "left": "left_join", "outer": "outer_join"}[how])(
        t, lambda a, c: a * 1000 + c, name="self" if named else None)
    j.to_stream().to("out")
    j.filter(lambda k, v: v % 2 == 0).to_stream().to("even")   # needs correct old values
    return b.build(optimize=optimize)


def test_self_join_rewrite_drops_the_result_store_and_describe_shows_it():
    opt, raw = self_join("inner", True), self_join("inner", False)
    assert sorted(raw.stores) == ["KTABLE-JOIN-STATE-STORE-0000000001", "t-STATE-STORE-0000000000"]
    assert sorted(opt.stores) == ["t-STATE-STORE-0000000000"]
    text = opt.describe()
    assert "Optimizations: on (passes: self-join: 1 rewrite(s))" in text
    assert ("Processor: KTABLE-JOINTHIS-0000000001 (stores: [t-STATE-STORE-0000000000]) "
            "(self-join of KTABLE-SOURCE-0000000000: one side, one store)") in text.splitlines()[4]
    assert "Processor: KTABLE-JOINTHIS-0000000001 (stores: [t-STATE-STORE-0000000000, " \
           "KTABLE-JOIN-STATE-STORE-0000000001])" in raw.describe()
    assert "JOINOTHER" not in text and "JOINOTHER" in raw.describe()
    assert "Optimizations: off" in raw.describe()
    # a named join store is a queryable result: kept
    assert "self" in self_join("inner", True, named=True).stores


@settings(max_examples=150, deadline=None)
@given(ups=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(0, 4)),
                              st.integers(0, 50)), max_size=40),
       how=st.sampled_from(["inner", "left", "outer"]), derived=st.booleans())
def test_optimized_and_unoptimized_self_joins_forward_identical_sequences(ups, how, derived):
    outputs = []
    for optimize in (True, False):
        with TopologyTestDriver(self_join(how, optimize, derived)) as d:
            seq = []
            for k, v, ts in ups:
                d.pipe_input("t", k, v, timestamp=ts)
                seq.append((out(d), [(r.key, r.value, r.timestamp) for r in d.read_output("even")]))
            outputs.append(seq)
    assert outputs[0] == outputs[1]
    # and both are the from-scratch answer: joiner(v, v) per row
    table = {}
    for k, v, _ts in ups:
        table.pop(k, None) if v is None else table.__setitem__(k, v)
    final = {}
    for step in outputs[0]:
        for k, v, _ in step[0]:
            final[k] = v
    want = {}
    for k, v in table.items():
        if derived:
            if v == 2:
                continue
            v += 100
        want[k] = v * 1000 + v
    assert {k: v for k, v in final.items() if v is not None} == want
