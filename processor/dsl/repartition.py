"""Repartition topics in the graph: ``sink(<base>-repartition) | source(<base>-repartition)``.

Invariant: everything upstream ends in one sub-topology at the sink; the source starts another,
read by the key the records now carry (placed by murmur2, our own partitioner), so a keyed
operator after it sees every record of a key in one task.
"""

from __future__ import annotations

from processor.graph import SinkAttrs, SourceAttrs
from processor.operators.sink import Sink
from processor.operators.source import StreamSource
from processor.topology.nodes import LogicalNode


def repartition_through(builder, parent: LogicalNode, topic: str, key_serde, value_serde,
                        partitions: int | None = None) -> LogicalNode:
    """``parent -> sink(topic) | source(topic)`` (``topic``: the internal topic's base name);
    returns the source node. ``partitions``: the topic's partition count, when declared.
    """
    b = builder
    sink = LogicalNode(
        name=b.new_name("KSTREAM-SINK"), kind="sink", sink_topic=topic,
        factory=lambda n: Sink(n.name, n.sink_topic, n.attrs.key_serde, n.attrs.value_serde, internal=True),
        attrs=SinkAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=topic, partitions=partitions),
    )
    b.add_node(sink, parent)
    source = LogicalNode(
        name=b.new_name("KSTREAM-SOURCE"), kind="source", source_topic=topic,
        factory=lambda n: StreamSource(n.name, n.source_topic, n.attrs.key_serde, n.attrs.value_serde),
        attrs=SourceAttrs(key_serde=key_serde, value_serde=value_serde, internal_topic=topic),
    )
    b.add_node(source)
    return source
