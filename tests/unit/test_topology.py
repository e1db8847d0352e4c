"""Topology building, sub-topologies, describe(), and the sanity checks."""

import pytest

from processor import StreamsBuilder
from processor.errors import TopologyError


def test_describe_lists_sources_processors_stores_and_sinks():
    b = StreamsBuilder()
    b.table("orders", store_name="orders-store").filter(lambda k, v: True).to_stream().to("big")
    b.stream("clicks").filter(lambda k, v: True).to("clicks-out")
    t = b.build()
    text = t.describe()
    assert text.splitlines() == [
        "Topologies:",
        "   Sub-topology: 0",
        "    Source: KTABLE-SOURCE-0000000000 (topics: [orders]) (stores: [orders-store])",
        "      --> KTABLE-FILTER-0000000001",
        "    Processor: KTABLE-FILTER-0000000001 (stores: [])",
        "      --> KTABLE-TOSTREAM-0000000002",
        "      <-- KTABLE-SOURCE-0000000000",
        "    Processor: KTABLE-TOSTREAM-0000000002 (stores: [])",
        "      --> KSTREAM-SINK-0000000003",
        "      <-- KTABLE-FILTER-0000000001",
        "    Sink: KSTREAM-SINK-0000000003 (topic: big)",
        "      --> none",
        "      <-- KTABLE-TOSTREAM-0000000002",
        "   Sub-topology: 1",
        "    Source: KSTREAM-SOURCE-0000000004 (topics: [clicks])",
        "      --> KSTREAM-FILTER-0000000005",
        "    Processor: KSTREAM-FILTER-0000000005 (stores: [])",
        "      --> KSTREAM-SINK-0000000006",
        "      <-- KSTREAM-SOURCE-0000000004",
        "    Sink: KSTREAM-SINK-0000000006 (topic: clicks-out)",
        "      --> none",
        "      <-- KSTREAM-FILTER-0000000005",
        "Stores:",
        "    orders-store (kv; owner: KTABLE-SOURCE-0000000000; changelog: <application-id>-orders-store-changelog)",
        "Optimizations: on (passes: self-join: 0 rewrite(s))",
    ]
    assert t.subtopology_of_topic() == {"orders": 0, "clicks": 1}


def test_passthrough_only_through_value_preserving_steps():
    b = StreamsBuilder()
    t = b.table("orders")
    t.filter(lambda k, v: True).to_stream().to("a")
    t.map_values(lambda v: v).to_stream().to("b")
    topo = b.build()
    assert topo.sink_nodes("a")[0].attrs.passthrough is True
    assert topo.sink_nodes("b")[0].attrs.passthrough is False


def test_reading_a_topic_twice_or_building_twice_is_refused():
    b = StreamsBuilder()
    b.table("x")
    b.stream("x")
    with pytest.raises(TopologyError, match="read by more than one source"):
        b.build()
    b2 = StreamsBuilder()
    b2.stream("y").to("z")
    b2.build()
    with pytest.raises(TopologyError, match="already built"):
        b2.stream("w")
