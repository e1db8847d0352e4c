"""Serde binding: every serde of a topology given its topic (``Serde.for_topic``).

Invariant: a node or store whose serdes do not depend on their topic keeps its attributes
(and hot paths) unchanged; operator state never holds a Schema Registry serde.
"""

from __future__ import annotations

from dataclasses import replace

from processor.errors import TopologyError
from processor.graph import GlobalJoinAttrs, SinkAttrs, SourceAttrs, UserProcessorAttrs
from processor.serde import Serde
from processor.serde.registry import RegistryAvroSerde


def holds_registry_serde(serde, depth: int = 0) -> bool:
    """Whether ``serde`` is, or wraps (``inner`` and the like), a Schema Registry serde."""
    if serde is None or depth > 4:
        return False
    if isinstance(serde, RegistryAvroSerde):
        return True
    return any(holds_registry_serde(v, depth + 1) for v in getattr(serde, "__dict__", {}).values()
               if isinstance(v, Serde))


def bind_serdes(topo, config: dict | None) -> None:
    """Give every serde its topic (``Serde.for_topic``): sources and sinks that of their node
    (user and internal topics alike), a store's serdes its changelog topic, as Kafka Streams
    configures store serdes, or, for a table source's store (which holds the source topic's
    bytes), the source topic. Serdes that do not depend on their topic return themselves, so
    nodes whose serdes are all such keep their attributes (and their hot paths) unchanged.

    A Schema Registry serde (``processor/serde/registry.py``) is refused as the serde of
    operator state (aggregates, joins): operators receive their state serdes when the graph
    is built, before any topic name is complete, so they could not be bound."""
    for n in topo.nodes:
        topic = n.source_topic or n.sink_topic
        if not topic or not isinstance(n.attrs, (SourceAttrs, SinkAttrs)):
            continue
        ks, vs = n.attrs.key_serde, n.attrs.value_serde
        bk = ks.for_topic(topic, True, config) if isinstance(ks, Serde) else ks
        bv = vs.for_topic(topic, False, config) if isinstance(vs, Serde) else vs
        if bk is not ks or bv is not vs:
            n.attrs = replace(n.attrs, key_serde=bk, value_serde=bv)
    for name, g in list(getattr(topo, "global_stores", {}).items()):
        ks, vs = g.key_serde, g.value_serde
        bk = ks.for_topic(g.topic, True, config) if isinstance(ks, Serde) else ks
        bv = vs.for_topic(g.topic, False, config) if isinstance(vs, Serde) else vs
        if bk is not ks or bv is not vs:
            topo.global_stores[name] = replace(g, key_serde=bk, value_serde=bv)
    for n in topo.nodes:   # a stream joined with a global table reads it with the table's bound serdes
        if isinstance(n.attrs, GlobalJoinAttrs) and n.attrs.global_store in topo.global_stores:
            g = topo.global_stores[n.attrs.global_store]
            if g.key_serde is not n.attrs.table_key_serde or g.value_serde is not n.attrs.table_value_serde:
                n.attrs = replace(n.attrs, table_key_serde=g.key_serde, table_value_serde=g.value_serde)
    for name, spec in list(topo.stores.items()):
        if spec.source_topic is None:
            for serde in (spec.key_serde, spec.value_serde):
                if holds_registry_serde(serde):
                    raise TopologyError(
                        f"store {name!r} ({spec.kind}, of {spec.owner}) has the Schema Registry serde "
                        f"{serde!r}: operator state cannot use one; give the operator a key_serde/"
                        f"value_serde such as Serdes.json() or Serdes.avro(schema) (fixed schema)")
        topic = spec.source_topic or topo.changelog_topic(name)
        ks, vs = spec.key_serde, spec.value_serde
        bk = ks.for_topic(topic, True, config) if isinstance(ks, Serde) else ks
        bv = vs.for_topic(topic, False, config) if isinstance(vs, Serde) else vs
        if bk is not ks or bv is not vs:
            topo.stores[name] = replace(spec, key_serde=bk, value_serde=bv)
    for n in topo.nodes:   # user processors see their stores with the serdes bound above
        if isinstance(n.attrs, UserProcessorAttrs) and n.attrs.store_specs:
            specs = tuple((name, topo.stores.get(name, spec)) for name, spec in n.attrs.store_specs)
            if any(a[1] is not b[1] for a, b in zip(specs, n.attrs.store_specs, strict=False)):
                n.attrs = replace(n.attrs, store_specs=specs)


def registry_serdes(topo) -> list:
    """The Schema Registry serdes of the sources, sinks and stores, global ones too (wrapped ones
    included)."""
    found, seen = [], set()

    def walk(serde, depth=0):
        if serde is None or depth > 4 or id(serde) in seen:
            return
        seen.add(id(serde))
        if isinstance(serde, RegistryAvroSerde):
            found.append(serde)
            return
        for v in getattr(serde, "__dict__", {}).values():
            if isinstance(v, Serde):
                walk(v, depth + 1)

    for n in topo.nodes:
        if isinstance(n.attrs, (SourceAttrs, SinkAttrs)):
            walk(n.attrs.key_serde)
            walk(n.attrs.value_serde)
    for spec in list(topo.stores.values()) + list(getattr(topo, "global_stores", {}).values()):
        walk(spec.key_serde)
        walk(spec.value_serde)
    return found
