"""A stream or a table as the DSL's other modules see it: its builder and its graph node.

Kafka Streams' ``AbstractStream`` (``builder``, ``graphNode``). This file owns both; the other
modules read them through ``graph_node_of`` and ``builder_of`` (a user's code never needs them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.builder import StreamsBuilder
    from processor.topology import LogicalNode


class AbstractStream:
    """The base of ``KStream`` and ``KTable``: a builder and a graph node."""

    def __init__(self, builder: StreamsBuilder, node: LogicalNode) -> None:
        self._builder = builder
        self._node = node


def graph_node_of(stream: AbstractStream) -> LogicalNode:
    """The graph node ``stream``'s records leave (a join's or an aggregation's parent)."""
    return stream._node


def builder_of(stream: AbstractStream) -> StreamsBuilder:
    """The builder ``stream`` belongs to (one topology's streams and tables share it)."""
    return stream._builder
