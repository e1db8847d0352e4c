"""Which tasks the fleet's assignor treats as stateful (``processor/runtime/fleet.py``
``fleet_rules``): the tasks of sub-topologies with stores of the user's. A stateless task (every
task has its ``__task`` and ``_bookkeeping`` stores) gets no standby and moves without a
warm-up, as in Kafka Streams."""

from __future__ import annotations

from types import SimpleNamespace

from processor import StreamsBuilder
from processor.config import StreamsConfig
from processor.runtime.fleet import fleet_rules
from processor.serde import Serdes


def _rules(topology, parts: dict[str, int]):
    host = SimpleNamespace(topology=topology.for_application("rules"), partition_counts=parts,
                           config=StreamsConfig(num_standby_replicas=1))
    return fleet_rules(host)


def test_a_stateless_sub_topology_has_no_stateful_task():
    b = StreamsBuilder()
    b.stream("in", key_serde=Serdes.string(), value_serde=Serdes.json()).filter(lambda k, v: v["n"] > 1).to("out")
    rules = _rules(b.build(), {"in": 3, "out": 3})
    assert sorted(rules.partitions_of_task) == [(0, 0), (0, 1), (0, 2)]
    assert rules.stateful == set()
    assert rules.num_standbys == 1


def test_only_the_sub_topologies_with_stores_are_stateful():
    b = StreamsBuilder()
    s = b.stream("in", key_serde=Serdes.string(), value_serde=Serdes.json())
    s.filter(lambda k, v: v["n"] > 1).to("filtered")
    # re-keyed, so the count runs in a second sub-topology, behind a repartition topic
    s.select_key(lambda k, v: v["group"]).group_by_key().count(name="counts").to_stream().to("counts-out")
    topology = b.build().for_application("rules")
    parts = {t: 2 for sub in range(len(topology.subtopologies)) for t in topology.source_topics(sub)}
    rules = _rules(b.build(), parts)
    with_stores = {sub for sub in range(len(topology.subtopologies)) if topology.stores_of(sub)}
    assert len(with_stores) == 1 and len(topology.subtopologies) == 2
    assert sorted(rules.stateful) == sorted((sub, p) for sub in with_stores for p in range(2))
