"""The plan of runs: in which order the backfill runs a topology's sub-topologies, which can still
receive rows from which, and which need a flush (graceful stop) at the end.

Invariant (``is_last_run``, checked by the runs loop): a sub-topology's run is its last (its tasks
then write their changelogs and stores) only when nothing that may still run can send it a row.
"""

from __future__ import annotations


def run_order(topo) -> list[int]:
    """Sub-topologies in topological order of the internal topics between them (a cycle, such as a
    foreign-key join's, is broken where it is entered first: runs repeat until nothing is pending)."""
    readers = topo.subtopology_of_topic()
    edges: dict[int, set[int]] = {i: set() for i in range(len(topo.subtopologies))}
    for topic, writers in topo.internal_topics().items():
        for w in writers:
            if readers[topic] != w:
                edges[w].add(readers[topic])
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(i):
        if state.get(i):
            return
        state[i] = 1
        for j in sorted(edges[i]):
            visit(j)
        order.append(i)

    for i in sorted(edges):
        visit(i)
    return order[::-1]

def sinks_reached(topo, sub: int, topics) -> set[str]:
    """Internal topics that records read from ``topics`` in sub-topology ``sub`` can cause
    records on (records flow along the graph's edges only)."""
    stack = [n for n in topo.subtopologies[sub] if n.source_topic in topics]
    seen, out = set(), set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.sink_topic and n.attrs.internal:
            out.add(n.sink_topic)
        stack.extend(n.children)
    return out

def receivers(topo, starts) -> set[int]:
    """Sub-topologies that can receive an internal row, directly or through others, when the
    ``(sub-topology, topics)`` of ``starts`` process records of those topics."""
    readers = topo.subtopology_of_topic()
    seen, out = set(), set()
    work = [(sub, frozenset(topics)) for sub, topics in starts]
    while work:
        sub, topics = work.pop()
        for t in sinks_reached(topo, sub, topics):
            r = readers[t]
            out.add(r)
            if (r, t) not in seen:
                seen.add((r, t))
                work.append((r, frozenset((t,))))
    return out

def defers_emissions(topo, sub) -> bool:
    """Whether a flush (graceful stop) can emit anything in this sub-topology: an aggregate
    under ``Emit.every`` (the only policy that keeps emissions pending)."""
    from processor.graph import AggregateAttrs

    return any(isinstance(n.attrs, AggregateAttrs) and n.attrs.emit.mode == "every"
               for n in topo.subtopologies[sub])


def is_last_run(topo, sub: int, run_topics: set[str], order: list[int], later_topics: dict[int, set[str]]) -> bool:
    """Whether a run of sub-topology ``sub`` that reads ``run_topics`` is its last: no flush is to
    come in it (``defers_emissions``) and nothing that may still run can send it a row: not
    this run (its records may reach itself through an internal topic), nor any other
    sub-topology of ``order`` reading the topics of ``later_topics`` (a sub-topology -> the
    topics it may still read: rows produced for it, or all it reads while its history or its
    flush is still to come). Then its tasks write their changelogs at the run's end."""
    if defers_emissions(topo, sub):
        return False
    later = [(sub, run_topics)] + [(i, later_topics[i]) for i in order if i != sub and later_topics.get(i)]
    return sub not in receivers(topo, later)
