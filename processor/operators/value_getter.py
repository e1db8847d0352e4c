"""Value getters: read a table's current value for a key, whatever produced the table.

Joins look up the other side's current value. A table read from a topic, an aggregate and a
join result are materialized, so their getter reads a store; a filtered or mapped table is not,
so its getter asks its parent's getter and applies the operator's own rule, the same function
the operator applies (as Kafka Streams' value getters do): those getters live beside their
operator (``FilterValueGetter`` in filter.py, ``MapValuesGetter`` in map_values.py,
``SelfJoinValueGetter`` in table_join.py). No table is materialized twice just to be joined.

Invariant: ``get(key, key_bytes)`` returns ``(value, timestamp)`` of the key's row exactly as
the table's last forwarded change left it, or ``None`` when the table has no row for the key.
An aggregate's getter reads its last-emitted column, not its current value, so a table whose
emissions are deferred (``Emit.every``) is seen as it was last forwarded.

Getter factories live in the logical node's attributes (``attrs.getter``, a
``processor.graph.GetterSpec``) as ``factory(node, context)`` and are resolved per task when an
operator initialises (``table_getter``).
"""

from __future__ import annotations

from typing import Any, Protocol

from processor.errors import TopologyError
from processor.graph import getter_spec
from processor.state import emitted as emitted_codec
from processor.state import timestamped

Row = tuple[Any, int]   # (value, timestamp) of a table's row


class ValueGetter(Protocol):
    def get(self, key: Any, kb: bytes) -> Row | None: ...



def table_getter(node, context):
    """The value getter of the table produced by logical ``node``, for the task of ``context``."""
    spec = getter_spec(node)
    if spec is None:
        raise TopologyError(f"the table produced by {node.name} cannot be looked up")
    return spec.factory(node, context)


class StoreValueGetter:
    """Rows of a store in the timestamped layout (``{8-byte ts}{value bytes}``)."""

    def __init__(self, store, value_serde):
        self.store = store
        self.value_serde = value_serde

    def get(self, key, kb):
        raw = self.store.get(kb)
        if raw is None:
            return None
        ts, vb = timestamped.decode(raw)
        return self.value_serde.deserialize(vb), ts


class EmittedValueGetter(StoreValueGetter):
    """An aggregate as last forwarded: its last-emitted column (``store``: the ``.emitted`` one)."""

    def get(self, key, kb):
        raw = self.store.get(kb)
        if raw is None:
            return None
        e = emitted_codec.decode(raw)
        return None if e.value is None else (self.value_serde.deserialize(e.value), e.timestamp)


def getter_stores(node) -> list[str]:
    """The stores a lookup of ``node``'s table reads (for ``describe()``)."""
    spec = getter_spec(node)
    if spec is not None and spec.stores is not None:
        return list(spec.stores)
    return getter_stores(node.parents[0]) if node.parents else []
