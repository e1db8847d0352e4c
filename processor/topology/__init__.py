"""The logical graph and what is derived from it, one module per concern (Kafka Streams keeps
them apart the same way: ``InternalTopologyBuilder``, the optimizer, ``TopologyDescription``):

=================  ==============================================================================
``nodes``          ``LogicalNode`` and ``StoreSpec``: what the DSL declares
``core``           ``Topology``: the frozen graph, sub-topologies, topics, stores, changelogs
``passes``         the optimization passes (named rewrites, each followed by a graph check)
``marks``          marks derived after the passes (pass-through sinks, sinks carrying a table)
``naming``         internal topic and changelog names
``serdes``         serde binding to topics (Schema Registry serdes)
``partitioning``   co-partitioning constraints and sink routes
``describe``       ``Topology.describe()``
=================  ==============================================================================
"""

from processor.topology.core import Topology
from processor.topology.nodes import LogicalNode, StoreSpec

__all__ = ["Topology", "LogicalNode", "StoreSpec"]
