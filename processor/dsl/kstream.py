"""KStream: a record stream, and ``BranchedKStream`` (``split()``)."""

from __future__ import annotations

from processor.dsl.repartition import repartition_through
from processor.errors import TopologyError
from processor.graph import GetterSpec, GlobalJoinAttrs, SinkAttrs, TableAttrs, UserProcessorAttrs
from processor.operators.filter import StreamFilter
from processor.operators.global_join import StreamGlobalTableJoin
from processor.operators.map_values import StreamMapValues
from processor.operators.sink import PassThrough, Sink
from processor.operators.stream_map import (
    StreamBranch,
    StreamFlatMap,
    StreamFlatMapValues,
    StreamMap,
    StreamPeek,
    StreamSelectKey,
)
from processor.operators.to_table import StreamToTable
from processor.operators.user_processor import UserProcessor
from processor.operators.value_getter import StoreValueGetter
from processor.serde import Serdes
from processor.topology import LogicalNode, StoreSpec
from processor.topology.naming import repartition_topic


class KStream:
    dsl_kind = "stream"

    def __init__(self, builder, node: LogicalNode, key_serde, value_serde, repartition_required: bool = False):
        self._builder = builder
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        # a key-changing operator (map, select_key, flat_map) came before: a later group_by_key,
        # join or to_table goes through a repartition topic by the new key first (Kafka Streams)
        self.repartition_required = repartition_required

    def _then(self, prefix, factory, name=None, value_serde=None, value_preserving=False, key_serde=None,
              key_changing=False):
        b = self._builder
        node = LogicalNode(name=b.new_name(prefix, name), kind="processor", factory=factory,
                           value_preserving=value_preserving)
        b.add_node(node, self._node)
        return KStream(b, node, key_serde or self.key_serde, value_serde or self.value_serde,
                       self.repartition_required or key_changing)

    # -- stateless record-at-a-time operators (processor/operators/stream_map.py) --------------
    def map(self, mapper, key_serde=None, value_serde=None, name: str | None = None) -> KStream:
        """``mapper(key, value) -> (key2, value2)``. Changes the key: a later ``group_by_key``,
        ``join`` or ``to_table`` repartitions first. Serdes default to this stream's key serde and
        JSON.
        """
        return self._then("KSTREAM-MAP", lambda n: StreamMap(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json(), key_serde=key_serde, key_changing=True)

    def select_key(self, mapper, key_serde=None, name: str | None = None) -> KStream:
        """``mapper(key, value) -> key2``, the value unchanged. Changes the key."""
        return self._then("KSTREAM-KEY-SELECT", lambda n: StreamSelectKey(n.name, mapper), name,
                          value_preserving=True, key_serde=key_serde, key_changing=True)

    def flat_map(self, mapper, key_serde=None, value_serde=None, name: str | None = None) -> KStream:
        """``mapper(key, value)`` -> an iterable of ``(key2, value2)``, forwarded in its order.
        Changes the key.
        """
        return self._then("KSTREAM-FLATMAP", lambda n: StreamFlatMap(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json(), key_serde=key_serde, key_changing=True)

    def flat_map_values(self, mapper, value_serde=None, name: str | None = None) -> KStream:
        """``mapper(value)`` -> an iterable of values, each with the record's key, in its order."""
        return self._then("KSTREAM-FLATMAPVALUES", lambda n: StreamFlatMapValues(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json())

    def peek(self, action, name: str | None = None) -> KStream:
        """``action(key, value)`` for each record, which goes on unchanged."""
        return self._then("KSTREAM-PEEK", lambda n: StreamPeek(n.name, action), name, value_preserving=True)

    def foreach(self, action, name: str | None = None) -> None:
        """``action(key, value)`` for each record; a terminal operation."""
        self._then("KSTREAM-FOREACH", lambda n: StreamPeek(n.name, action), name, value_preserving=True)

    def process(self, processor, stores=(), name: str | None = None) -> KStream:
        """A user ``processor.Processor`` (a class, or a zero-argument factory: one instance per
        task) over this stream, with the stores ``stores`` (added by ``builder.add_state_store``);
        returns the stream of what it forwards (serdes: this stream's; the key may change, so a
        later keyed operator repartitions).
        """
        if not callable(processor):
            raise TopologyError(f"process() takes a Processor class or a factory of one, not {processor!r}")
        if isinstance(stores, str):
            stores = [stores]
        b = self._builder
        node_name = b.new_name("KSTREAM-PROCESSOR", name)
        # a DSL table's store (table(store_name=), to_table(name), an aggregate's name=...) is
        # connected read-only; the processor looks its table up, so it joins the table's
        # sub-topology (co-partitioned with it, as Kafka Streams requires)
        specs, read_only, lookups = {}, {}, []
        for s in stores:
            dsl = b.dsl_store_for_process(s, node_name)
            if dsl is None:
                specs[s] = b.connect_user_store(s, node_name)
                continue
            specs[s], owner = dsl
            read_only[s] = owner.name
            if all(x is not owner for x in lookups):
                lookups.append(owner)
        node = LogicalNode(name=node_name, kind="processor", stores=list(specs), lookups=lookups,
                           attrs=UserProcessorAttrs(store_specs=tuple(specs.items())),
                           factory=lambda n: UserProcessor(n.name, processor, dict(n.attrs.store_specs),
                                                           read_only))
        b.add_node(node, self._node)
        return KStream(b, node, self.key_serde, self.value_serde, True)

    def split(self, name: str | None = None) -> BranchedKStream:
        """Branches: ``.branch(predicate, name=...)`` (repeatable), then ``.default_branch()``
        or ``.no_default_branch()`` -> ``{branch name: KStream}``; each record goes to the first
        branch whose predicate holds (Kafka Streams' ``BranchedKStream``).
        """
        return BranchedKStream(self, name)

    def repartition(self, key_serde=None, value_serde=None, partitions: int | None = None,
                    name: str | None = None) -> KStream:
        """Through the internal topic ``<application-id>-<name>-repartition`` (``partitions``
        partitions, default: as its writers' source topics), placed by the key (murmur2).
        """
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise TopologyError(f"repartition(partitions=...) takes a positive number, not {partitions!r}")
        return self._through_repartition(name, key_serde, value_serde, partitions)

    def _through_repartition(self, name, key_serde=None, value_serde=None, partitions=None) -> KStream:
        b = self._builder
        base = b.new_name("KSTREAM-REPARTITION", name)
        ks, vs = key_serde or self.key_serde, value_serde or self.value_serde
        source = repartition_through(b, self._node, repartition_topic(base), ks, vs, partitions)
        return KStream(b, source, ks, vs)

    def _by_key(self, key_serde=None, value_serde=None) -> KStream:
        """This stream, or, after a key-changing operator, this stream through a repartition
        topic (written with ``key_serde``/``value_serde`` when given: the serdes of what follows,
        as Kafka Streams' Materialized ones).
        """
        return self._through_repartition(None, key_serde, value_serde) if self.repartition_required else self

    def filter(self, predicate, name: str | None = None) -> KStream:
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate), name,
                          value_preserving=True)

    def filter_not(self, predicate, name: str | None = None) -> KStream:
        return self._then("KSTREAM-FILTER", lambda n: StreamFilter(n.name, predicate, negate=True), name,
                          value_preserving=True)

    def map_values(self, mapper, value_serde=None, name: str | None = None) -> KStream:
        """``mapper(value) -> new value``; the result's serde defaults to JSON."""
        return self._then("KSTREAM-MAPVALUES", lambda n: StreamMapValues(n.name, mapper), name,
                          value_serde=value_serde or Serdes.json())

    def merge(self, other: KStream, name: str | None = None) -> KStream:
        """Records of both streams, each in its own order. Both sources join one sub-topology,
        so their topics must be co-partitioned (equal partition counts).
        """
        b = self._builder
        node = LogicalNode(name=b.new_name("KSTREAM-MERGE", name), kind="processor",
                           factory=lambda n: PassThrough(n.name), value_preserving=True)
        b.add_node(node, self._node, other._node)
        return KStream(b, node, self.key_serde, self.value_serde,
                       self.repartition_required or other.repartition_required)

    def group_by_key(self, key_serde=None, value_serde=None):
        """Group by the record key: no repartition unless a key-changing operator came before."""
        from processor.dsl.grouped import KGroupedStream

        ks, vs = key_serde or self.key_serde, value_serde or self.value_serde
        return KGroupedStream(self, None, ks, vs, repartition=self.repartition_required)

    def to_table(self, name: str | None = None, key_serde=None, value_serde=None):
        """The stream as a table (materialized in store ``name``): each record an update of its
        key, a None value a delete, records without a key dropped (and counted); after a
        key-changing operator, through a repartition topic first.
        """
        src = self._by_key(key_serde, value_serde)
        b = self._builder
        ks, vs = key_serde or src.key_serde, value_serde or src.value_serde
        node_name = b.new_name("KSTREAM-TOTABLE")
        store = name or f"{node_name}-STATE-STORE"
        b.check_store_names_free(store)
        node = LogicalNode(
            name=node_name, kind="processor", stores=[store],
            factory=lambda n: StreamToTable(n.name, store, ks, vs),
            attrs=TableAttrs(getter=GetterSpec(lambda n, ctx: StoreValueGetter(ctx.get_store(store), vs),
                                               stores=(store,))))
        b.add_node(node, src._node)
        b.add_store(StoreSpec(store, node_name, None, ks, vs))
        return b.table_of(node, ks, vs, store_name=store)

    def group_by(self, selector, key_serde=None, value_serde=None):
        """``selector(key, value) -> group_key``; goes through a repartition topic. The group
        key serde defaults to string, the value serde to this stream's.
        """
        from processor.dsl.grouped import KGroupedStream

        return KGroupedStream(self, selector, key_serde or Serdes.string(), value_serde or self.value_serde)

    # -- joins -------------------------------------------------------------------------------
    def _join(self, other, joiner, windows, how, name, value_serde, key_selector=None):
        kind = getattr(other, "dsl_kind", None)
        if kind == "global-table":
            return self._join_global(other, joiner, key_selector, how, name, value_serde, windows)
        if key_selector is not None:
            raise TopologyError("key_selector= is for a join with a GlobalKTable")
        me = self._by_key()
        if me is not self:
            return me._join(other, joiner, windows, how, name, value_serde)
        if kind == "stream" and other.repartition_required:
            other = other._by_key()
        if kind == "table":
            if windows is not None:
                raise TopologyError("a stream-table join takes no JoinWindows")
            if how == "outer":
                raise TopologyError("a stream-table join is inner or left; outer_join needs two streams")
            from processor.dsl.joins import stream_table_join

            out = stream_table_join(self, other, joiner, how, name)
            out.value_serde = value_serde or Serdes.json()
            return out
        if kind == "stream":
            from processor.dsl.stream_join import stream_stream_join

            return stream_stream_join(self, other, joiner, windows, how, name, value_serde)
        raise TopologyError(f"join takes a KStream or a KTable, not {type(other).__name__}")

    def join(self, other, joiner, windows=None, name: str | None = None, value_serde=None,
             key_selector=None) -> KStream:
        """With a KTable: each record joined with the table's current row for its key
        (``joiner(value, row)``; no row, no output). With a GlobalKTable: with the row of
        ``key_selector(key, value)`` (no repartition: every task holds the whole table). With a
        KStream: records of both streams whose keys are equal and whose timestamps are within
        ``windows`` (``JoinWindows.of(ms).grace(ms)``), ``joiner(left, right)``.
        """
        return self._join(other, joiner, windows, "inner", name, value_serde, key_selector)

    def left_join(self, other, joiner, windows=None, name: str | None = None, value_serde=None,
                  key_selector=None) -> KStream:
        """As ``join``, and ``joiner(value, None)`` for a record without a match (stream-stream:
        once its window has closed).
        """
        return self._join(other, joiner, windows, "left", name, value_serde, key_selector)

    def _join_global(self, table, joiner, key_selector, how, name, value_serde, windows) -> KStream:
        if windows is not None:
            raise TopologyError("a join with a GlobalKTable takes no JoinWindows")
        if how == "outer":
            raise TopologyError("a join with a GlobalKTable is inner or left")
        if not callable(key_selector):
            raise TopologyError("a join with a GlobalKTable needs key_selector=(key, value) -> table key")
        b = self._builder
        store, ks, vs = table.store_name, table.key_serde, table.value_serde
        node = LogicalNode(name=b.new_name("KSTREAM-GLOBALJOIN" if how == "inner" else "KSTREAM-GLOBALLEFTJOIN",
                                           name),
                           kind="processor",
                           attrs=GlobalJoinAttrs(global_store=store, table_key_serde=ks, table_value_serde=vs),
                           # the serdes of the node's attrs: bound to the table's topic by the topology
                           factory=lambda n: StreamGlobalTableJoin(n.name, store, key_selector, joiner, how,
                                                                   n.attrs.table_key_serde,
                                                                   n.attrs.table_value_serde))
        b.add_node(node, self._node)
        # the key is unchanged: nothing after it repartitions because of this join
        return KStream(b, node, self.key_serde, value_serde or Serdes.json(), self.repartition_required)

    def outer_join(self, other, joiner, windows=None, name: str | None = None, value_serde=None) -> KStream:
        """Stream-stream only: as ``left_join`` for both sides (``joiner(None, right)`` too)."""
        return self._join(other, joiner, windows, "outer", name, value_serde)

    def to(self, topic_or_extractor, key_serde=None, value_serde=None, name: str | None = None) -> None:
        """To a topic, or to the topic ``extractor(key, value)`` names for each record (it must
        exist: else the record is an ``OutputError`` under the on-error policy).
        """
        b = self._builder
        ks = key_serde or self.key_serde
        vs = value_serde or self.value_serde
        if callable(topic_or_extractor):
            topic, extractor = None, topic_or_extractor
        elif isinstance(topic_or_extractor, str) and topic_or_extractor:
            topic, extractor = topic_or_extractor, None
        else:
            raise TopologyError(f"to() takes a topic name or a topic extractor (key, value) -> topic, "
                                f"not {topic_or_extractor!r}")
        node = LogicalNode(
            name=b.new_name("KSTREAM-SINK", name), kind="sink", sink_topic=topic,
            factory=lambda n: Sink(n.name, n.sink_topic, n.attrs.key_serde, n.attrs.value_serde,
                                   passthrough=n.attrs.passthrough, carries_table=n.attrs.carries_table,
                                   extractor=n.attrs.extractor),
            attrs=SinkAttrs(key_serde=ks, value_serde=vs, stream_key_serde=self.key_serde, extractor=extractor),
        )
        b.add_node(node, self._node)


class BranchedKStream:
    """``KStream.split(name)``: branches added in order; the first predicate that holds wins.
    The result maps each branch's name (prefixed by the split's name when given) to its stream;
    a branch without a name is numbered from 1, as in Kafka Streams.
    """

    def __init__(self, stream: KStream, name: str | None):
        self._stream = stream
        self._name = name
        self._branches: list[tuple[str, object]] = []
        self._done = False

    def _full(self, name: str | None, default: bool) -> str:
        part = name if name is not None else ("0" if default else str(len(self._branches) + 1))
        return f"{self._name}{part}" if self._name else part

    def branch(self, predicate, name: str | None = None) -> BranchedKStream:
        if self._done:
            raise TopologyError("this split() is finished (default_branch/no_default_branch was called)")
        if not callable(predicate):
            raise TopologyError(f"branch() takes a predicate (key, value) -> bool, not {predicate!r}")
        full = self._full(name, False)
        if any(full == n for n, _ in self._branches):
            raise TopologyError(f"split(): branch name {full!r} is used twice")
        self._branches.append((full, predicate))
        return self

    def default_branch(self, name: str | None = None) -> dict:
        return self._finish(self._full(name, True))

    def no_default_branch(self) -> dict:
        return self._finish(None)

    def _finish(self, default: str | None) -> dict:
        if self._done:
            raise TopologyError("this split() is finished already")
        self._done = True
        s = self._stream
        b = s._builder
        names = [n for n, _ in self._branches] + ([default] if default is not None else [])
        if default is not None and default in names[:-1]:
            raise TopologyError(f"split(): branch name {default!r} is used twice")
        preds = [p for _, p in self._branches]
        has_default = default is not None
        router = LogicalNode(name=b.new_name("KSTREAM-BRANCH", self._name), kind="processor",
                             factory=lambda n: StreamBranch(n.name, preds, has_default), value_preserving=True)
        b.add_node(router, s._node)
        out = {}
        for branch_name in names:
            child = LogicalNode(name=b.new_name("KSTREAM-BRANCHCHILD", None), kind="processor",
                                factory=lambda n: PassThrough(n.name), value_preserving=True)
            b.add_node(child, router)
            out[branch_name] = KStream(b, child, s.key_serde, s.value_serde, s.repartition_required)
        return out
