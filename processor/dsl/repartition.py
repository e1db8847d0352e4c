"""Repartition topics in the graph: ``sink(<base>-repartition) | source(<base>-repartition)``.

Invariant: everything upstream ends in one sub-topology at the sink; the source starts another,
read by the key the records now carry (placed by murmur2, our own partitioner), so a keyed
operator after it sees every record of a key in one task.
"""

from __future__ import annotations

from typing import Any, cast

from processor.graph import SinkAttrs, SourceAttrs
from processor.operators.sink import Sink
from processor.operators.source import StreamSource
from processor.topology.nodes import LogicalNode


def repartition_through(builder: Any, parent: LogicalNode, topic: str, key_serde: Any, value_serde: Any,
                        partitions: int | None = None) -> LogicalNode:
    """Adds ``parent -> sink(topic) | source(topic)`` to the graph.

    Args:
        builder: The ``StreamsBuilder`` of the graph.
        parent: The node whose records go through the topic.
        topic: The internal topic's base name.
        key_serde: The topic's key serde.
        value_serde: The topic's value serde.
        partitions: The topic's partition count, when declared.

    Returns:
        The source node, which reads the topic.
    """
    b = builder
    sink = LogicalNode(
        name=b.new_name("KSTREAM-SINK"), kind="sink", sink_topic=topic,
        factory=_internal_sink,
        attrs=SinkAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=topic, partitions=partitions),
    )
    b.add_node(sink, parent)
    source = LogicalNode(
        name=b.new_name("KSTREAM-SOURCE"), kind="source", source_topic=topic,
        factory=_internal_source,
        attrs=SourceAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=topic),
    )
    b.add_node(source)
    return source


def _internal_sink(n: LogicalNode) -> Sink:
    """The operator of a repartition topic's sink node (serdes: its attrs', as the topology binds them)."""
    a = cast(SinkAttrs, n.attrs)
    return Sink(n.name, n.sink_topic, a.key_serde, a.value_serde, internal=True)


def _internal_source(n: LogicalNode) -> StreamSource:
    """The operator of a repartition topic's source node."""
    a = cast(SourceAttrs, n.attrs)
    return StreamSource(n.name, n.source_topic, a.key_serde, a.value_serde)
