"""Which table sources the backfill reduces to their last real changes per key, and the
reduction itself (docs/backfill.md "What it does", step 4).

Invariant: a source is reduced only when every store and output downstream of it provably ends
the same from each key's last two real changes as from the whole history (``compaction_plan``
names the reason per source); the reduction keeps every poison record, so the on-error policy
meets exactly what a full replay meets. What each operator is to a reduced replay is what its
class declares (``replay``: ``processor/operators/replay.py``), not a list of types kept here.
"""

from __future__ import annotations

from backfill.rows import KEY, SEQ, VALUE
from processor.operators import replay as R


def operator_of(node):
    """The operator a graph node builds (one instance, to read what its class declares)."""
    return node.factory(node)


def replay_of(node) -> str:
    """What ``node``'s operator is to a reduced replay (``processor/operators/replay.py``)."""
    return node.factory(node).replay


def compaction_plan(topo, emit_outputs: bool = False, held_outputs=(), refusals: dict | None = None
                    ) -> dict[str, str]:
    """``{external table topic: reason}`` for every table source whose history may be reduced to
    the last two real changes per key (docs/backfill.md "What it does", step 4): every store and output downstream of it
    ends the same from them. That holds when what reads the table's changes is only table
    filters and map_values, a table's sink, or a foreign-key join, and what looks it up is only a
    foreign-key join.

    A foreign-key join reached straight from the source (no filter or map_values between) as
    its right side, or as the left side of an inner join, is *transparent*: what reads its
    results may be anything (an aggregation included), because the backfill gives it the same
    changes either way (``transparent_joins``). Any other foreign-key join's result table must
    be read by the same rule: a left join resolves a left row without a foreign key at once, so
    an intermediate change of the left table reaches the results. A map_values in front of a
    join's left side refuses the reduction: it skips an unchanged result, so the join's version
    store could name a record the reduction drops. Anything else (aggregations, primary-key and
    stream-table joins, a table's changes as a stream) replays every record: its state depends on
    the history (an aggregation keeps, at 0, a group that only an intermediate value reached).
    Below a table's ``to_stream()``, stateless stream steps (filter, map_values, map, select_key,
    flat_map, flat_map_values, peek, foreach, split, merge) ending in user sinks need no more
    than the last changes (no store sees their records; ``--emit-outputs`` refuses a stream sink
    anyway), while a repartition, to_table, join, aggregation, window or ``process()`` there
    replays every record. Streams are never reduced: each of their records is an event. Nor is a
    table whose records reach a sub-topology holding a user processor (``process()``), its own or
    another through an internal topic: every input record of that task moves the stream time
    it punctuates on.

    With ``emit_outputs`` the sinks are written too, so a source is reduced only when every user
    sink downstream of it (through internal topics, joins and aggregations, up to a transparent
    join) carries a table (``outputs.table_sinks``: the history's result is its final table) that
    starts empty (not in ``held_outputs``, the sink topics holding records at the snapshot), and
    no table map_values or other foreign-key join lies between (each skips a result equal to the
    one before, so the timestamp of a sink's last record may come from a change the reduction
    drops). A key the reduction leaves absent then needs no tombstone: the topic never held it.
    ``refusals`` receives, for each table source refused, the reader that needs every record."""
    op = replay_of

    lookers: dict[int, list] = {}
    for n in topo.nodes:
        for x in n.lookups:
            lookers.setdefault(id(x), []).append(n)
    out = {}
    for src in topo.nodes:
        if src.attrs.internal if hasattr(src.attrs, "internal") else False:
            continue
        if not src.source_topic or op(src) != R.TABLE_SOURCE:
            continue
        if src.attrs.timestamp_extractor is not None:
            # the reduction keeps the last changes in offset order, which are the last ones in
            # time only by the broker's timestamps
            if refusals is not None:
                refusals[src.source_topic] = ("every record replayed (a timestamp extractor gives its rows "
                                              "their times)")
            continue
        transparent = transparent_joins(src, lookers)
        why, via = None, set()      # why: the first reader that needs every record, named
        stack = [(src, False)]      # (node, a map_values lies between the source and it)
        while stack and why is None:
            n, mapped = stack.pop()
            for reader in lookers.get(id(n), ()):
                if op(reader) in (R.FK_SUBSCRIPTION_RECEIVER, R.FK_RESPONSE_RESOLVER):
                    via.add("foreign-key join")
                else:
                    why = why or f"{reader.name} looks the table up: its results depend on the history"
            for c in n.children:
                t = op(c)
                if t in (R.TABLE_STEP, R.TABLE_MAP):
                    stack.append((c, mapped or t == R.TABLE_MAP))
                elif t == R.TO_STREAM:
                    stateful = _stateful_after_to_stream(topo, c, lookers, op)
                    if stateful is not None:
                        why = why or (f"{stateful.name} ({operator_of(stateful).kind}) reads the table's changes "
                                      f"as a stream: each change is an event to it")
                    via.add("table sink" if all(op(x) == R.SINK for x in c.children) else
                            "stateless stream steps to sinks")
                elif t == R.SINK and not c.attrs.internal:
                    via.add("table sink")
                elif id(c) in transparent:
                    via.add("foreign-key join")
                elif t == R.FK_SUBSCRIPTION_SENDER and mapped:
                    # the version store would name the record of a change map_values skipped
                    why = why or (f"{c.name} (a foreign-key join's left side) follows a map_values, "
                                  f"which skips unchanged results")
                elif t in (R.FK_SUBSCRIPTION_SENDER, R.FK_RESPONDER):
                    via.add("foreign-key join")
                    # the join's result table is read by the same rule: what reads it must end
                    # the same from the results of the last changes (an aggregation does not: a
                    # group only an intermediate left row reached keeps its count of 0)
                    stack.extend((x, False) for x in downstream(topo, c, lookers)
                                 if op(x) == R.PASS_THROUGH and getattr(x.attrs, "result_store", None))
                else:
                    why = why or (f"{c.name} ({operator_of(c).kind}): its state depends on the history (a group, "
                                  f"a window or a join row that only an intermediate change reached)")
        if why is None:
            # every input record of a task moves the stream time its user processors punctuate
            # on: the source's own sub-topology and every one its records reach (internal topics,
            # foreign-key subscriptions too: found in review)
            reached = {id(x) for x in [src] + downstream(topo, src, lookers)}
            subs = [sub for sub in topo.subtopologies if any(id(x) in reached for x in sub)]
            user = next((n for sub in subs for n in sub if op(n) == R.USER_PROCESSOR), None)
            if user is not None:
                why = (f"{user.name} (a user processor in a sub-topology its records reach) punctuates on "
                       f"the task's stream time")
        if why is None and emit_outputs:
            why = _outputs_need_history(topo, src, lookers, set(held_outputs), op, transparent)
            if why:
                why = f"--emit-outputs: {why}"
        if why is not None:
            if refusals is not None:
                refusals[src.source_topic] = f"every record replayed ({why})"
            continue
        out[src.source_topic] = "last real changes per key (" + (", ".join(sorted(via)) or "no reader") + ")"
    return out


def _stateful_after_to_stream(topo, to_stream, lookers, op):
    """The first node past a table's ``to_stream()`` whose result depends on every change it
    receives (a store, a lookup, a repartition, a user processor), or None when only stateless
    stream steps and user sinks follow: then the stores end the same from the last changes, and
    the outputs are settled by ``--emit-outputs``' own rule (a stream sink needs every record)."""
    for x in downstream(topo, to_stream, lookers):
        t = op(x)
        if x.stores or x.lookups or lookers.get(id(x)):
            return x
        if t == R.SINK:
            if x.attrs.internal:
                return x
        elif t not in (R.STATELESS, R.PASS_THROUGH):
            return x
    return None


def transparent_joins(src, lookers) -> set[int]:
    """Ids of the foreign-key join nodes that table source ``src`` reaches straight (no filter or
    map_values between) as the join's right side (its responder and subscription receiver), or
    as the left side of an inner join (its subscription sender and response resolver).

    Their results are the same changes whether ``src``'s history is whole or reduced to the last
    two real changes per key, because of how the backfill runs: a sub-topology's whole input
    history is its first run, before any response exists, so the first run leaves the join's
    result table empty (an inner join resolves a left row without a foreign key to a tombstone
    of nothing); and within a run a foreign-key join record replaces an earlier one of its pair
    (``backfill.rows.RowCollector._supersede``), so each left row gets one response per run,
    the last one its subscription's right row met: answering the left row's last version (the
    last change, kept), with the right row as its last real change (kept) or the row at the
    subscription (the same, when that change came before it). Its timestamp is that change's
    or the subscription's, the same too, provided the kept records meet the other inputs in the
    order of the full replay: a partition whose timestamps go backwards is replayed whole
    (``in_time_order``; found in review). (Through a filter or a map_values the changes a join
    sees are no longer the source's, and a left join resolves an intermediate left row without
    a foreign key at once: those joins are not transparent.)"""
    out = set()
    for n in list(src.children) + lookers.get(id(src), []):
        o = operator_of(n)
        if o.replay in (R.FK_RESPONDER, R.FK_SUBSCRIPTION_RECEIVER) or (
                o.replay in (R.FK_SUBSCRIPTION_SENDER, R.FK_RESPONSE_RESOLVER) and o.how == "inner"):
            out.add(id(n))
    return out


def downstream(topo, node, lookers=None, stop=frozenset()) -> list:
    """Every node whose input depends on ``node``'s output: its children, what looks its table
    up, and the readers of an internal topic one of them writes, transitively (``node`` excluded;
    not past the nodes whose ids are in ``stop``, themselves excluded)."""
    if lookers is None:
        lookers = {}
        for n in topo.nodes:
            for x in n.lookups:
                lookers.setdefault(id(x), []).append(n)
    readers: dict[str, list] = {}
    for n in topo.nodes:
        if n.source_topic:
            readers.setdefault(n.source_topic, []).append(n)
    seen, out, stack = {id(node)} | set(stop), [], [node]
    while stack:
        n = stack.pop()
        nxt = list(n.children) + lookers.get(id(n), [])
        if n.sink_topic and n.attrs.internal:
            nxt += readers.get(n.sink_topic, [])
        for c in nxt:
            if id(c) not in seen:
                seen.add(id(c))
                out.append(c)
                stack.append(c)
    return out


def _outputs_need_history(topo, src, lookers, held: set, op, transparent=frozenset()) -> str | None:
    """Why the user sinks downstream of table source ``src`` (up to its ``transparent`` joins)
    need every record of it under ``--emit-outputs`` (None: they do not)."""
    from backfill.outputs import table_sinks

    tables = table_sinks(topo)
    for n in downstream(topo, src, lookers, stop=transparent):
        if op(n) == R.TABLE_MAP:
            return (f"{n.name} (a table map_values) skips unchanged results, so a sink's last "
                    f"timestamp may come from a change the reduction drops")
        if op(n) in (R.FK_SUBSCRIPTION_SENDER, R.FK_RESPONDER):
            return (f"{n.name} (a foreign-key join) skips unchanged results, so a sink's last "
                    f"timestamp may come from a change the reduction drops")
        if n.kind == "sink" and not n.attrs.internal:
            if n.sink_topic is None:
                return f"{n.name} sends to the topics its topic extractor names: each receives every record"
            if n.sink_topic not in tables:
                return f"{n.sink_topic} is a stream sink: it receives what every change produces"
            if n.sink_topic in held:
                return f"{n.sink_topic} already holds records: its tombstones need the history"
    return None

def last_changes(rows, key_serde=None, value_serde=None):
    """Rows of one table partition in offset order -> the last two real changes of each key, in
    offset order, and every poison record. A real change is what the table source does not skip
    as a no-op (a value whose bytes differ from the key's current ones; a tombstone of a present
    key). The last one gives the store's value and its timestamp (of the last real change); the
    one before it lets a foreign-key join unsubscribe the previous foreign key as a replay of
    every record does. Poison (what the table source would not apply: no key, or bytes that do
    not deserialize with the given serdes) is kept whatever follows it, so the task
    dead-letters it (or fails, or skips it) exactly as a full replay does."""
    keep = keep_last_changes((([r[KEY] for r in rows], [r[VALUE] for r in rows], rows),), key_serde, value_serde)
    keep.sort(key=lambda r: r[SEQ])
    return keep

def keep_last_changes(batches, key_serde, value_serde) -> list:
    """``(keys, values, items)`` batches in offset order -> the items ``last_changes`` keeps
    (unordered): each key's last two real changes and every poison record. (The backfill's
    hottest loop: every input row of a compacted table passes here once.)"""
    kcheck = key_serde.check if key_serde is not None else None
    vcheck = value_serde.check if value_serde is not None else None
    last: dict = {}           # key -> (item of the change before, item of the last change, its value)
    good_keys: set = set()
    kept = []
    for keys, values, items in batches:
        for k, v, x in zip(keys, values, items, strict=False):
            ent = last.get(k)
            if ent is None and k not in good_keys:
                if k is None:
                    kept.append(x)
                    continue
                if kcheck is not None:
                    try:
                        kcheck(k)
                    except Exception:
                        kept.append(x)
                        continue
                good_keys.add(k)
            if ent is None:
                if v is not None:
                    if vcheck is not None:
                        try:
                            vcheck(v)
                        except Exception:
                            kept.append(x)
                            continue
                    last[k] = (None, x, v)
            elif ent[2] != v:   # (bytes equal to the current value's passed the check already)
                if v is not None and vcheck is not None:
                    try:
                        vcheck(v)
                    except Exception:
                        kept.append(x)
                        continue
                last[k] = (ent[1], x, v)
    kept += [x for prev, cur, _ in last.values() for x in (prev, cur) if x is not None]
    return kept

def last_changes_of_messages(batches, key_serde, value_serde) -> tuple[int, list | None]:
    """``last_changes`` over Kafka messages as they are read (offset order): (messages read, the
    kept rows in offset order, or None when the partition's timestamps go backwards: see
    ``in_time_order``). Only kept messages become rows."""
    count = [0]
    last_ts = [None]

    def columns():
        for msgs in batches:
            count[0] += len(msgs)
            stamps = [m.timestamp()[1] for m in msgs]
            if stamps:
                if not in_time_order(stamps, last_ts[0]):
                    raise _OutOfTimeOrder
                last_ts[0] = stamps[-1]
            yield [m.key() for m in msgs], [m.value() for m in msgs], msgs

    from backfill.rows import message_row

    try:
        kept = keep_last_changes(columns(), key_serde, value_serde)
    except _OutOfTimeOrder:   # (no need to read on: the partition is read again, whole)
        return count[0], None
    keep = [message_row(m) for m in kept]
    keep.sort(key=lambda r: r[SEQ])
    return count[0], keep


class _OutOfTimeOrder(Exception):
    pass


def in_time_order(stamps, before=None) -> bool:
    """Whether timestamps ``stamps`` (of one partition, in offset order, after ``before``) never
    go backwards: the reduction's precondition. A task merges its inputs by timestamp
    (``backfill.rows.merge``); in a partition whose timestamps only rise, each record's place
    among the other inputs' records depends on its own timestamp alone, so the records the
    reduction keeps meet the others in the order of the full replay. Where a timestamp goes
    backwards, a dropped record can hold back the ones after it (a right row's change then answers
    a subscription it would have answered before, with another timestamp): such a partition is
    replayed whole."""
    prev = stamps[0] if before is None else before
    for t in stamps:
        if t < prev:
            return False
        prev = t
    return True

