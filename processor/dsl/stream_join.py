"""Stream-stream windowed joins behind ``KStream.join/left_join/outer_join(other_stream, ...)``.

Graph shape (node names as in Kafka Streams)::

    left  --> KSTREAM-JOINTHIS-<i>   (writes <base>-this-store,  scans <base>-other-store) --+
    right --> KSTREAM-JOINOTHER-<j>  (writes <base>-other-store, scans <base>-this-store)  --+--> KSTREAM-MERGE-<k>

``<base>`` is the ``name=`` given, else ``KSTREAM-JOIN-<i>``. Left and outer joins add
``<base>-outer-store`` (records still without a match), shared by both sides. Both side nodes
feed one merge node, so both inputs are in one sub-topology (co-partitioned). Keys are compared
as bytes of the LEFT stream's key serde. Semantics: ``processor/operators/stream_join.py``.

Self-join (KIP-862, pass ``self-join`` in ``topology.py``): when both inputs are the same
stream, the pass calls ``_rewrite_stream_self_join``, which drops KSTREAM-JOINOTHER and its
store and runs ``StreamSelfJoin`` over ``<base>-this-store`` alone. It is offered only when it
is provably output-equal, i.e. only for

* inner joins (the pass's rule, as KIP-862 in Kafka): a left/outer join's output also depends
  on its outer store. Unoptimized, a record ``r`` is looked up on the left side before the
  other store holds it: without another match it goes into the outer store, or, out of order
  with its window already ended, is emitted unmatched at once (as Kafka Streams), and then
  matches ITSELF on the right side. A rewrite would drop that output and the outer store
  (state of a running application); such joins keep their two stores.
* windows with ``before == after``: both stores hold the same records (each store's retention
  follows its own observed time, and both see every record in the same order), but the two
  passes scan ``[t - before, t + after]`` and ``[t - after, t + before]``; with ``before ==
  after`` that is one range of one store. (The topology pass decides the ``how`` and
  same-input conditions; the window condition is decided here, by not marking the join at all.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from processor.dsl.abstract_stream import builder_of, graph_node_of
from processor.dsl.windows import JoinWindows
from processor.errors import TopologyError
from processor.graph import JoinResultAttrs, JoinSideAttrs, SelfJoin
from processor.operators.sink import PassThrough
from processor.operators.stream_join import HOWS, StreamJoinSide, StreamSelfJoin
from processor.serde import Serde, Serdes
from processor.state.join_window_key import JoinOuterKeySerde, JoinWindowKeySerde
from processor.topology import LogicalNode, StoreSpec

if TYPE_CHECKING:  # pragma: no cover
    from processor.dsl.kstream import KStream
    from processor.functions import ValueJoiner


def stream_stream_join(left: KStream, right: KStream, joiner: ValueJoiner, windows: JoinWindows | None, how: str,
                       name: str | None, value_serde: Serde | None) -> KStream:
    """``KStream.join/left_join/outer_join`` of two streams: the two sides, their stores and the merge."""
    if not isinstance(windows, JoinWindows):
        raise TopologyError(f"a stream-stream join needs JoinWindows (e.g. JoinWindows.of(100)), "
                            f"not {type(windows).__name__}")
    if how not in HOWS:
        raise TopologyError(f"how must be one of {HOWS}, not {how!r}")
    if builder_of(left) is not builder_of(right):
        raise TopologyError("both streams of a join must come from one StreamsBuilder")
    b = builder_of(left)
    base = b.peek_name("KSTREAM-JOIN", name)
    this_store, other_store = f"{base}-this-store", f"{base}-other-store"
    outer_store = None if how == "inner" else f"{base}-outer-store"
    shared = [outer_store] if outer_store else []
    b.check_store_names_free(this_store, other_store, *shared)
    ks, lvs, rvs = left.key_serde, left.value_serde, right.value_serde
    vs = value_serde or Serdes.json()

    this_name = b.new_name("KSTREAM-JOINTHIS", name and f"{name}-join-this")
    other_name = b.new_name("KSTREAM-JOINOTHER", name and f"{name}-join-other")
    self_join = None
    if windows.before_ms == windows.after_ms:
        self_join = SelfJoin(kind="stream", how=how, other=other_name,
                             rewrite=_rewrite_stream_self_join(base, joiner, windows, ks, lvs, this_store,
                                                               other_store))
    this = LogicalNode(
        name=this_name, kind="processor",
        factory=lambda n: StreamJoinSide(n.name, base, "left", how, joiner, windows, ks, this_store,
                                         other_store, outer_store, lvs, rvs),
        stores=[this_store, other_store] + shared,
        # both sides co-partitioned (docs/semantics.md "Partitioning")
        attrs=JoinSideAttrs(copartition_with=other_name, self_join=self_join))
    other = LogicalNode(
        name=other_name, kind="processor",
        factory=lambda n: StreamJoinSide(n.name, base, "right", how, joiner, windows, ks, other_store,
                                         this_store, outer_store, rvs, lvs),
        stores=[other_store, this_store] + shared, attrs=JoinSideAttrs())
    b.add_node(this, graph_node_of(left))
    b.add_node(other, graph_node_of(right))
    merge = LogicalNode(name=b.new_name("KSTREAM-MERGE", name and f"{name}-join-merge"), kind="processor",
                        factory=lambda n: PassThrough(n.name), value_preserving=True,
                        attrs=JoinResultAttrs())   # its sides are constrained by the join itself
    b.add_node(merge, this, other)
    b.add_store(StoreSpec(this_store, this.name, None, JoinWindowKeySerde(ks), lvs, kind="join-window"))
    b.add_store(StoreSpec(other_store, other.name, None, JoinWindowKeySerde(ks), rvs, kind="join-window"))
    if outer_store:
        b.add_store(StoreSpec(outer_store, this.name, None, JoinOuterKeySerde(ks),
                              lvs if lvs == rvs else Serdes.bytes(), kind="join-outer"))
    return b.stream_of(merge, ks, vs)


def _rewrite_stream_self_join(base: str, joiner: ValueJoiner, windows: JoinWindows, key_serde: Serde,
                              value_serde: Serde, this_store: str, other_store: str) -> Callable[[Any, Any], None]:
    """The ``self-join`` rewrite of an inner stream-stream join of a stream with itself.

    One ``StreamSelfJoin`` over this-store (why it is output-equal: ``operators/stream_join.py``).
    """

    def rewrite(topology: Any, this: Any) -> None:
        info = this.attrs.self_join
        topology.remove_node(topology.node(info.other))
        del topology.stores[other_store]
        this.factory = lambda n: StreamSelfJoin(n.name, base, joiner, windows, key_serde, this_store, value_serde)
        this.stores = [this_store]
        this.attrs = replace(this.attrs, self_join=None, self_join_of=this.parents[0].name)
    return rewrite
