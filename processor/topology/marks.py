"""Marks the ``Topology`` derives from the graph after the passes (not optimizations: they
change no result): pass-through sinks and sinks that carry a table.

Invariant: a mark is recomputed from the graph alone, so a graph cloned for another
application gets the same marks.
"""

from __future__ import annotations

from dataclasses import replace


def mark_passthrough_sinks(topo) -> None:
    """A sink whose value comes, through value-preserving steps only (filters, to_stream), from
    a source, an aggregate or a materialized join result with the same value serde writes the
    bytes it was read from or stored as, instead of serializing the value again
    (``Sink.passthrough``)."""
    from processor.graph import AggregateAttrs

    def origin(cur):
        return (cur.kind in ("source", "table-source") or isinstance(cur.attrs, AggregateAttrs)
                or getattr(cur.attrs, "result_store", None) is not None)

    for n in topo.nodes:
        if n.kind != "sink":
            continue
        cur, ok = n, True
        while not origin(cur):
            if len(cur.parents) != 1:
                ok = False
                break
            cur = cur.parents[0]
            if not origin(cur) and not cur.value_preserving:
                ok = False
                break
        if ok:
            if isinstance(cur.attrs, AggregateAttrs):
                serde = topo.stores[cur.stores[0]].value_serde
            elif getattr(cur.attrs, "result_store", None) is not None:
                serde = topo.stores[cur.attrs.result_store].value_serde
            else:
                serde = cur.attrs.value_serde
            ok = n.attrs.value_serde is serde
        n.attrs = replace(n.attrs, passthrough=ok)


def mark_table_sinks(topo) -> None:
    from processor.graph import ToStreamAttrs, getter_spec

    # a topic extractor may write any topic, a table sink's too: then no sink is the only writer
    # of its topic
    extractors = any(n.kind == "sink" and n.attrs.extractor is not None for n in topo.nodes)
    writers: dict[str, int] = {}
    for n in topo.nodes:
        if n.kind == "sink":
            writers[n.sink_topic] = writers.get(n.sink_topic, 0) + 1
    for n in topo.nodes:
        if n.kind != "sink" or n.attrs.internal or n.sink_topic is None:
            continue
        ok = (not extractors and writers[n.sink_topic] == 1 and len(n.parents) == 1
              and isinstance(n.parents[0].attrs, ToStreamAttrs) and len(n.parents[0].parents) == 1
              and getter_spec(n.parents[0].parents[0]) is not None)
        if ok != n.attrs.carries_table:
            n.attrs = replace(n.attrs, carries_table=ok)
