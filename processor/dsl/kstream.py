"""KStream: a record stream."""

from __future__ import annotations

from processor.errors import TopologyError
from processor.graph import SinkAttrs
from processor.operators.filter import StreamFilter
from processor.operators.map_values import StreamMapValues
from processor.operators.sink import PassThrough, Sink
from processor.serde import Serdes
from processor.topology import LogicalNode


class KStream:
    def __init__(self, builder, node: LogicalNode, key_serde, value_serde):
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde

    def _then(self, prefix, factory, name=None, value_serde=None, value_preserving=False):
        b = self._builder
        node = LogicalNode(name=b.new_name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving)
        b.add_node(node, self._node)
        return KStream(b, node, self.key_serde, value_serde or self.value_serde)

    def filter(self, predicate, name: str | None = None) -> "KStream":
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate), name,
                          value_preserving=True)

    def filter_not(self, predicate, name: str | None = None) -> "KStream":
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate, negate=True), name,
                          value_preserving=True)

    def map_values(self, mapper, value_serde=None, name: str | None = None) -> "KStream":
        """``mapper(value) -> new value``; the result's serde defaults to JSON."""
        return self._then("KSTREAM-MAPVALUES", lambda n: StreamMapValues(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json())

    def merge(self, other: "KStream", name: str | None = None) -> "KStream":
        """Records of both streams, each in its own order. Both sources join one sub-topology,
        so their topics must be co-partitioned (equal partition counts)."""
        b = self._builder
        node = LogicalNode(name=b.new_name("KSTREAM-MERGE", name), kind="processor",
                           factory=lambda n: PassThrough(n.name), value_preserving=True)
        b.add_node(node, self._node, other._node)
        return KStream(b, node, self.key_serde, self.value_serde)

    def group_by_key(self, key_serde=None, value_serde=None):
        """Group by the record key (no repartition: the key has not changed)."""
        from processor.dsl.grouped import KGroupedStream

        return KGroupedStream(self, None, key_serde or self.key_serde, value_serde or self.value_serde)

    def group_by(self, selector, key_serde=None, value_serde=None):
        """``selector(key, value) -> group_key``; goes through a repartition topic. The group
        key serde defaults to string, the value serde to this stream's."""
        from processor.dsl.grouped import KGroupedStream

        return KGroupedStream(self, selector, key_serde or Serdes.string(), value_serde or self.value_serde)

    # -- joins -------------------------------------------------------------------------------
    def _join(self, other, joiner, windows, how, name, value_serde):
        from processor.dsl.ktable import KTable

        if isinstance(other, KTable):
            if windows is not None:
                raise TopologyError("a stream-table join takes no JoinWindows")
            if how == "outer":
                raise TopologyError("a stream-table join is inner or left; outer_join needs two streams")
            from processor.dsl.joins import stream_table_join

            out = stream_table_join(self, other, joiner, how, name)
            out.value_serde = value_serde or Serdes.json()
            return out
        if isinstance(other, KStream):
            from processor.dsl.stream_join import stream_stream_join

            return stream_stream_join(self, other, joiner, windows, how, name, value_serde)
        raise TopologyError(f"join takes a KStream or a KTable, not {type(other).__name__}")

    def join(self, other, joiner, windows=None, name: str | None = None, value_serde=None) -> "KStream":
        """With a KTable: each record joined with the table's current row for its key
        (``joiner(value, row)``; no row, no output). With a KStream: records of both streams
        whose keys are equal and whose timestamps are within ``windows``
        (``JoinWindows.of(ms).grace(ms)``), ``joiner(left, right)``."""
        return self._join(other, joiner, windows, "inner", name, value_serde)

    def left_join(self, other, joiner, windows=None, name: str | None = None, value_serde=None) -> "KStream":
        """As ``join``, and ``joiner(value, None)`` for a record without a match (stream-stream:
        once its window has closed)."""
        return self._join(other, joiner, windows, "left", name, value_serde)

    def outer_join(self, other, joiner, windows=None, name: str | None = None, value_serde=None) -> "KStream":
        """Stream-stream only: as ``left_join`` for both sides (``joiner(None, right)`` too)."""
        return self._join(other, joiner, windows, "outer", name, value_serde)

    def to(self, topic: str, key_serde=None, value_serde=None, name: str | None = None) -> None:
        b = self._builder
        ks = key_serde or self.key_serde
        vs = value_serde or self.value_serde
        node = LogicalNode(
            name=b.new_name("KSTREAM-SINK", name), kind="sink", sink_topic=topic,
            factory=lambda n: Sink(n.name, n.sink_topic, n.attrs.key_serde, n.attrs.value_serde,
                                   passthrough=n.attrs.passthrough, carries_table=n.attrs.carries_table),
            attrs=SinkAttrs(key_serde=ks, value_serde=vs, stream_key_serde=self.key_serde),
        )
        b.add_node(node, self._node)
