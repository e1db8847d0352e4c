"""The stateless stream operators (issue 29): map, select_key, flat_map, flat_map_values, peek,
foreach, split, to(extractor), repartition, to_table, and the repartition a key change implies.

Each is a differential: the test driver against a plain-Python model of Kafka Streams'
documented semantics over the same random input, compared as exact lists (a map would hide
duplicates). Bad input (a mapper returning a non-pair, an extractor naming no topic or a topic
that does not exist) under each on-error policy: dead-lettered with the reason, skipped, or
raised."""

import json
import random

import pytest

from processor import StreamsBuilder
from processor.errors import ConfigError, OutputError, TopologyError, UserFunctionError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def _input(seed=1, n=400, keys=25):
    rnd = random.Random(seed)
    return [(f"k{rnd.randrange(keys):02d}", {"x": rnd.randrange(60), "u": f"u{rnd.randrange(6)}"}, 1000 + i)
            for i in range(n)]


def _run(topo, records, outputs, topics=None, on_error="dlq"):
    with TopologyTestDriver(topo, on_error=on_error, topics=topics) as d:
        for k, v, ts in records:
            d.pipe_input("in", k, v, timestamp=ts)
        return {o: [(r.key, r.value, r.timestamp) for r in d.read_output(o)] for o in outputs}, d


def test_map_select_key_flat_map_values_and_flat_map_follow_the_model():
    b = StreamsBuilder()
    s = b.stream("in")
    s.map(lambda k, v: (v["u"], {"x2": v["x"] * 2, "k": k})).to("map")
    s.select_key(lambda k, v: f"{k}-{v['u']}").to("select")
    s.flat_map_values(lambda v: [v["x"]] * (v["x"] % 3)).to("fmv")
    s.flat_map(lambda k, v: [(f"{k}/{i}", i) for i in range(v["x"] % 4)]).to("fm")
    recs = _input()
    got, _ = _run(b.build(), recs, ["map", "select", "fmv", "fm"])
    assert got["map"] == [(v["u"], {"x2": v["x"] * 2, "k": k}, ts) for k, v, ts in recs]
    assert got["select"] == [(f"{k}-{v['u']}", v, ts) for k, v, ts in recs]
    assert got["fmv"] == [(k, v["x"], ts) for k, v, ts in recs for _ in range(v["x"] % 3)]
    assert got["fm"] == [(f"{k}/{i}", i, ts) for k, v, ts in recs for i in range(v["x"] % 4)]
    assert len(got["fm"]) > len(recs) // 2 and len(got["fmv"]) > len(recs) // 2


def test_peek_and_foreach_see_every_record_in_order_and_peek_forwards_it():
    seen_peek, seen_each = [], []
    b = StreamsBuilder()
    s = b.stream("in")
    s.filter(lambda k, v: v["x"] % 2 == 0).peek(lambda k, v: seen_peek.append((k, v["x"]))).to("out")
    assert s.foreach(lambda k, v: seen_each.append((k, v["x"]))) is None
    recs = _input(seed=2)
    got, _ = _run(b.build(), recs, ["out"])
    assert seen_each == [(k, v["x"]) for k, v, _ in recs]
    assert seen_peek == [(k, v["x"]) for k, v, _ in recs if v["x"] % 2 == 0]
    assert got["out"] == [(k, v, ts) for k, v, ts in recs if v["x"] % 2 == 0]


def test_split_sends_each_record_to_the_first_branch_that_holds():
    b = StreamsBuilder()
    branches = b.stream("in").split(name="x-").branch(lambda k, v: v["x"] < 10, name="low") \
        .branch(lambda k, v: v["x"] < 40, name="mid").branch(lambda k, v: v["x"] < 5, name="never") \
        .default_branch(name="rest")
    assert list(branches) == ["x-low", "x-mid", "x-never", "x-rest"]
    for name, stream in branches.items():
        stream.to(f"out-{name}")
    unnamed = StreamsBuilder()
    plain = unnamed.stream("in").split().branch(lambda k, v: v["x"] % 2 == 0).branch(lambda k, v: True) \
        .no_default_branch()
    assert list(plain) == ["1", "2"]
    recs = _input(seed=3)
    got, _ = _run(b.build(), recs, [f"out-{n}" for n in branches])

    def model(v):
        return "x-low" if v["x"] < 10 else "x-mid" if v["x"] < 40 else "x-rest"

    for name in branches:
        assert got[f"out-{name}"] == [(k, v, ts) for k, v, ts in recs if model(v) == name], name
    assert got["out-x-never"] == []
    with pytest.raises(TopologyError, match="used twice"):
        StreamsBuilder().stream("in").split().branch(lambda k, v: 1, name="a").branch(lambda k, v: 1, name="a")


def test_no_default_branch_drops_and_counts_what_no_branch_takes():
    b = StreamsBuilder()
    br = b.stream("in").split().branch(lambda k, v: v["x"] < 20, name="low").no_default_branch()
    br["low"].to("low")
    recs = _input(seed=4)
    got, d = _run(b.build(), recs, ["low"])
    assert got["low"] == [(k, v, ts) for k, v, ts in recs if v["x"] < 20]
    branch = next(n for n in d.topology.nodes if n.name.startswith("KSTREAM-BRANCH-"))
    assert d.tasks[0].metrics()[branch.name]["unbranched"] == sum(1 for _, v, _ in recs if v["x"] >= 20)


def test_to_with_a_topic_extractor_routes_each_record_and_read_output_reads_any_of_its_topics():
    b = StreamsBuilder()
    b.stream("in").to(lambda k, v: f"by-{v['u']}", value_serde=Serdes.json())
    recs = _input(seed=5)
    users = sorted({v["u"] for _, v, _ in recs})
    got, _ = _run(b.build(), recs, [f"by-{u}" for u in users])
    for u in users:
        assert got[f"by-{u}"] == [(k, v, ts) for k, v, ts in recs if v["u"] == u]
    assert "extractor: test_to_with_a_topic_extractor" in b.build().describe()


def test_read_output_of_a_topic_only_extractors_name_needs_serdes_when_theirs_differ():
    b = StreamsBuilder()
    s = b.stream("in")
    s.to(lambda k, v: "x", value_serde=Serdes.json())
    s.map_values(lambda v: str(v["x"])).to(lambda k, v: "x", value_serde=Serdes.string())
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("in", "a", {"x": 1}, timestamp=1)
        with pytest.raises(ConfigError, match="different serdes"):
            d.read_output("x")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("in", "a", {"x": 1}, timestamp=1)
        assert [r.value for r in d.read_output("x", Serdes.string(), Serdes.bytes())] == [b'{"x":1}', b"1"]


@pytest.mark.parametrize("policy", ["dlq", "skip", "fail"])
def test_an_extractor_naming_no_topic_or_a_missing_one_follows_the_on_error_policy(policy):
    b = StreamsBuilder()
    b.stream("in").to(lambda k, v: None if v["x"] == 0 else "exists" if v["x"] % 2 else "missing")
    recs = [("a", {"x": 1}, 1), ("b", {"x": 0}, 2), ("c", {"x": 2}, 3), ("d", {"x": 3}, 4)]
    if policy == "fail":
        with pytest.raises(OutputError, match="named no topic"):
            _run(b.build(), recs, [], topics=["exists"], on_error=policy)
        with pytest.raises(OutputError, match="named topic 'missing', which does not exist"):
            _run(b.build(), [r for r in recs if r[1]["x"]], [], topics=["exists"], on_error=policy)
        return
    with TopologyTestDriver(b.build(), on_error=policy, topics=["exists"]) as d:
        for k, v, ts in recs:
            d.pipe_input("in", k, v, timestamp=ts)
        assert [(r.key, r.value) for r in d.read_output("exists")] == [("a", {"x": 1}), ("d", {"x": 3})]
        dead = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
    if policy == "skip":
        assert dead == []
        return
    assert [r.key for r in dead] == [b"b", b"c"]
    messages = [dict(r.headers)["__streams.errors.message"].decode() for r in dead]
    assert "named no topic: it returned None" in messages[0]
    assert "named topic 'missing', which does not exist" in messages[1]


@pytest.mark.parametrize("policy", ["dlq", "skip", "fail"])
def test_a_mapper_that_returns_a_non_pair_follows_the_on_error_policy(policy):
    b = StreamsBuilder()
    b.stream("in").map(lambda k, v: (k, v) if v["x"] else [k]).to("out")
    b2 = StreamsBuilder()
    b2.stream("in").flat_map(lambda k, v: [(k, 1), (k, 2)] if v["x"] else [(k, 1), "oops"]).to("out")
    recs = [("a", {"x": 1}, 1), ("b", {"x": 0}, 2), ("c", {"x": 2}, 3)]
    for topo in (b.build(), b2.build()):
        if policy == "fail":
            with pytest.raises(UserFunctionError, match="not a \\(key, value\\) pair"):
                _run(topo, recs, ["out"], on_error=policy)
            continue
        with TopologyTestDriver(topo, on_error=policy) as d:
            for k, v, ts in recs:
                d.pipe_input("in", k, v, timestamp=ts)
            out = [r.key for r in d.read_output("out")]
            dead = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
        # the bad record leaves nothing behind (flat_map: not its first, good, pair either)
        assert out in (["a", "c"], ["a", "a", "c", "c"])
        if policy == "dlq":
            assert [(r.key, json.loads(r.value)) for r in dead] == [(b"b", {"x": 0})]
            assert "not a (key, value) pair" in dict(dead[0].headers)["__streams.errors.message"].decode()
        else:
            assert dead == []


def test_a_key_change_repartitions_before_group_by_key_join_and_to_table_and_nothing_else_does():
    def topo(change_key: bool):
        b = StreamsBuilder()
        s = b.stream("in")
        keyed = s.select_key(lambda k, v: v["u"]) if change_key else s.filter(lambda k, v: True)
        keyed.map_values(lambda v: v["x"]).group_by_key().count(name="counts")
        keyed.to_table(name="last")
        keyed.peek(lambda k, v: None).join(b.table("tab"), lambda v, t: [v, t]).to("joined")
        return b.build()

    changed, unchanged = topo(True).describe(), topo(False).describe()
    # group_by_key, to_table, join: each a sink to a repartition topic and a source from it
    assert changed.count("-repartition)") == 3 and changed.count("-repartition])") == 3
    assert "-repartition" not in unchanged
    assert "Source: KSTREAM-SOURCE" in changed
    # the repartitioned count is by the new key: the model counts per user
    recs = _input(seed=6)
    with TopologyTestDriver(topo(True)) as d:
        for k, v, ts in recs:
            d.pipe_input("in", k, v, timestamp=ts)
        counts = d.get_store("counts")
        last = d.get_store("last")
        users = sorted({v["u"] for _, v, _ in recs})
        assert [counts.get(u) for u in users] == [sum(1 for _, v, _ in recs if v["u"] == u) for u in users]
        assert [last.get(u) for u in users] == [[v for _, v, _ in recs if v["u"] == u][-1] for u in users]


def test_to_table_materializes_updates_drops_null_keys_and_skips_no_ops():
    b = StreamsBuilder()
    b.stream("in").to_table(name="t").to_stream().to("changes")
    recs = [("a", {"x": 1}, 1), ("a", {"x": 1}, 2), (None, {"x": 9}, 3), ("b", {"x": 2}, 4), ("a", None, 5),
            ("a", None, 6), ("b", {"x": 3}, 7)]
    with TopologyTestDriver(b.build()) as d:
        for k, v, ts in recs:
            d.pipe_input("in", k, v, timestamp=ts)
        got = [(r.key, r.value, r.timestamp) for r in d.read_output("changes")]
        assert got == [("a", {"x": 1}, 1), ("b", {"x": 2}, 4), ("a", None, 5), ("b", {"x": 3}, 7)]
        assert d.get_store("t").get("b") == {"x": 3} and d.get_store("t").get("a") is None
        node = next(n for n in d.topology.nodes if n.name.startswith("KSTREAM-TOTABLE"))
        assert d.tasks[0].metrics()[node.name] == {"null_keys_skipped": 1, "noop_updates_skipped": 2}


def test_repartition_goes_through_a_named_internal_topic_with_the_declared_partitions():
    b = StreamsBuilder()
    b.stream("in").repartition(partitions=5, name="by-user").to("out")
    topo = b.build().for_application("app")
    assert topo.internal_topic_partitions({"in": 2}) == {"app-by-user-repartition": 5}
    b2 = StreamsBuilder()
    b2.stream("in").repartition().to("out")
    (topic, n), = b2.build().for_application("app").internal_topic_partitions({"in": 3}).items()
    assert topic.startswith("app-KSTREAM-REPARTITION-") and topic.endswith("-repartition") and n == 3
    recs = _input(seed=7)
    got, _ = _run(b.build(), recs, ["out"])
    assert got["out"] == recs and got["out"][0][0] == recs[0][0]
    with pytest.raises(TopologyError, match="positive number"):
        StreamsBuilder().stream("in").repartition(partitions=0)


def test_to_table_after_a_key_change_repartitions_with_its_own_serdes():
    """Found in review: the repartition before to_table writes with to_table's serdes."""
    b = StreamsBuilder()
    b.stream("in").select_key(lambda k, v: v["id"]).to_table(name="by-id", key_serde=Serdes.json())
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("in", "a", {"id": 7}, timestamp=1)
        assert d.get_store("by-id").get(7) == {"id": 7}
        assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []


@pytest.mark.parametrize("rekeyed", ["right", "both"])
def test_a_stream_stream_join_after_a_key_change_joins_by_the_new_key(rekeyed):
    """The join of two streams whose key changed on one or both sides equals the same join
    of streams that arrive already keyed by the new key (in the same order)."""
    from processor import JoinWindows

    rnd = random.Random(11)
    recs = [(side, f"k{rnd.randrange(9)}", {"u": f"u{rnd.randrange(4)}", "x": i}, 1000 + i * 3)
            for i, side in enumerate(rnd.choice("lr") for _ in range(200))]

    def topo(change_key: bool):
        b = StreamsBuilder()
        left, right = b.stream("l"), b.stream("r")
        if change_key:
            right = right.select_key(lambda k, v: v["u"])
            if rekeyed == "both":
                left = left.select_key(lambda k, v: v["u"])
        left.join(right, lambda a, c: [a["x"], c["x"]], JoinWindows.of(10)).to("out")
        return b.build()

    def run(change_key: bool):
        with TopologyTestDriver(topo(change_key)) as d:
            for side, k, v, ts in recs:
                # (a side that is not rekeyed arrives keyed by "u" in both runs)
                rekeyed_side = side == "r" or rekeyed == "both"
                d.pipe_input(side, k if change_key and rekeyed_side else v["u"], v, timestamp=ts)
            assert d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes()) == []
            return [(r.key, r.value, r.timestamp) for r in d.read_output("out")]

    expected = run(False)
    assert len(expected) > 20
    assert run(True) == expected
