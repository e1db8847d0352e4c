"""Typed node attributes (processor/graph.py) and the builder API the DSL builds with."""

import dataclasses
import re
from pathlib import Path

import pytest

from processor import Emit, JoinWindows, StreamsBuilder, TimeWindows
from processor.errors import TopologyError
from processor.graph import (
    AggregateAttrs,
    GetterSpec,
    JoinResultAttrs,
    JoinSideAttrs,
    ProcessorAttrs,
    SelfJoin,
    SinkAttrs,
    SourceAttrs,
    TableAttrs,
    TableSourceAttrs,
    ToStreamAttrs,
    getter_spec,
)
from processor.serde import Serdes
from processor.topology import LogicalNode

DSL = Path(__file__).resolve().parents[2] / "processor" / "dsl"


def _attrs_by_prefix(topo):
    out = {}
    for n in topo.nodes:
        out.setdefault(n.name.rsplit("-", 1)[0], set()).add(type(n.attrs))
    return out


def test_every_node_kind_has_its_own_attribute_class():
    b = StreamsBuilder()
    orders = b.table("orders", partitioner="murmur2")
    customers = b.table("customers")
    orders.filter(lambda k, v: True).map_values(lambda v: v).to_stream().to("out")
    orders.group_by(lambda k, v: (v["c"], 1)).count(emit=Emit.every(10), name="per-c")
    clicks = b.stream("clicks")
    clicks.group_by_key().windowed_by(TimeWindows.of(10)).count(name="w")
    clicks.join(b.stream("views"), lambda lv, r: 1, JoinWindows.of(5), name="sj").to("joined")
    orders.join(customers, lambda lv, r: 1, name="pk")
    orders.join_on_foreign_key(customers, lambda v: v["c"], lambda lv, r: 1, name="fk")
    topo = b.build()
    kinds = _attrs_by_prefix(topo)
    assert kinds["KTABLE-SOURCE"] == {TableSourceAttrs, SourceAttrs}   # user tables, FK internal sources
    assert kinds["KTABLE-FILTER"] == kinds["KTABLE-MAPVALUES"] == {TableAttrs}
    assert kinds["KTABLE-TOSTREAM"] == {ToStreamAttrs}
    assert kinds["KSTREAM-SINK"] == kinds["KTABLE-SINK"] == {SinkAttrs}
    assert kinds["KTABLE-AGGREGATE"] == {AggregateAttrs}
    assert kinds["KTABLE-JOINTHIS"] == kinds["KTABLE-JOINOTHER"] == {JoinSideAttrs}
    assert type(topo.node("sj-join-this").attrs) is type(topo.node("sj-join-other").attrs) is JoinSideAttrs
    assert kinds["KTABLE-MERGE"] == {JoinResultAttrs} and type(topo.node("sj-join-merge").attrs) is JoinResultAttrs
    assert kinds["KTABLE-SELECT"] == kinds["KTABLE-FK-JOIN-RESOLVE"] == {ProcessorAttrs}

    src = topo.source_node("orders")
    assert src.attrs.partitioner == "murmur2" and not src.attrs.internal and src.attrs.dedup
    aggs = {n.stores[0]: n.attrs for n in topo.nodes if isinstance(n.attrs, AggregateAttrs)}
    assert aggs["per-c"].kind == "count" and aggs["per-c"].emit == Emit.every(10) and aggs["per-c"].windows is None
    assert aggs["per-c"].getter.stores == ("per-c.emitted",)
    assert aggs["w"].windows == TimeWindows.of(10) and aggs["w"].getter is None
    repart = topo.source_node("per-c-repartition")
    assert repart.attrs.internal and repart.attrs.internal_topic == "per-c-repartition"
    sub_sink = topo.sink_nodes("fk-subscription-registration-topic")[0]
    assert sub_sink.attrs.partitions_from == "reader"
    assert sub_sink.attrs.route_like_topics == ("customers",)   # resolved by the topology
    sub_source = topo.source_node("fk-subscription-registration-topic")
    assert sub_source.attrs.partitioning == "explicit" and sub_source.attrs.dedup is False
    assert topo.node("sj-join-this").attrs.copartition_with == "sj-join-other"


def test_attributes_are_frozen_and_a_node_refuses_an_untyped_dict():
    with pytest.raises(TypeError, match="NodeAttrs"):
        LogicalNode(name="x", kind="processor", factory=lambda n: None, attrs={"internal": True})
    a = SinkAttrs(key_serde=Serdes.string(), value_serde=Serdes.json())
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.passthrough = True


def test_a_source_or_sink_with_attributes_of_another_kind_is_refused():
    b = StreamsBuilder()
    s = b.stream("in")
    s.to("out")
    sink = b._nodes[-1]   # (test only: reach in to break the graph)
    sink.attrs = ProcessorAttrs()
    with pytest.raises(TopologyError, match="attributes of another kind"):
        b.build()


def test_self_join_rewrite_replaces_attributes_on_the_optimized_copy_only():
    b = StreamsBuilder()
    t = b.table("t")
    t.join(t, lambda lv, r: (lv, r))
    s = b.stream("s")
    s.join(s, lambda lv, r: 1, JoinWindows.of(3))
    built = b.build()
    sides = [n for n in built.nodes if isinstance(n.attrs, JoinSideAttrs) and n.attrs.self_join_of]
    assert {n.attrs.self_join_of for n in sides} == {"KTABLE-SOURCE-0000000000", "KSTREAM-SOURCE-0000000004"}
    assert all(n.attrs.self_join is None for n in sides)
    merge = next(n for n in built.nodes if n.name.startswith("KTABLE-MERGE"))
    assert merge.attrs.getter.stores is None   # read through the table's store now
    # the builder's own nodes keep the offered rewrite (the unoptimized form)
    offered = [n for n in b._nodes if isinstance(n.attrs, JoinSideAttrs) and n.attrs.self_join]
    assert {n.attrs.self_join.kind for n in offered} == {"table", "stream"}
    assert all(isinstance(n.attrs.self_join, SelfJoin) and n.attrs.self_join_of is None for n in offered)
    with pytest.raises(TopologyError, match="already built"):   # a built builder takes no more nodes
        t.filter(lambda k, v: True)


def test_getter_spec_only_for_tables_that_can_be_looked_up():
    b = StreamsBuilder()
    t = b.table("t")
    f = t.filter(lambda k, v: True)
    st = b.stream("s")
    w = st.group_by_key().windowed_by(TimeWindows.of(5)).count()
    assert isinstance(getter_spec(t._node), GetterSpec)
    assert getter_spec(t._node).stores == ("t-STATE-STORE-0000000000",)
    assert getter_spec(f._node).stores is None
    assert getter_spec(st._node) is None and getter_spec(w._node) is None
    with pytest.raises(TopologyError, match="cannot be looked up"):
        t.join(w, lambda lv, r: 1)


def test_builder_api_names_and_store_names():
    b = StreamsBuilder()
    assert b.peek_name("P") == "P-0000000000" == b.peek_name("P")
    assert b.new_name("P") == "P-0000000000"
    assert b.new_name("P", "given") == "given"          # a given name still takes an index
    assert b.peek_name("Q") == "Q-0000000002"
    assert b.peek_name("Q", "mine") == "mine"
    b.table("t", store_name="taken")
    b.check_store_names_free("free", "other")
    with pytest.raises(TopologyError, match="'taken' is used twice"):
        b.check_store_names_free("free", "taken")
    with pytest.raises(TopologyError, match="'taken' is used twice"):
        b.stream("s").group_by_key().count(name="taken")


def test_dsl_modules_use_only_the_builders_public_api():
    private = re.compile(r"\b(?:b|builder|_builder)\._[a-z]\w*")
    offenders = [f"{p.name}: {m.group(0)}" for p in sorted(DSL.glob("*.py")) if p.name != "builder.py"
                 for m in private.finditer(p.read_text())]
    assert offenders == []
