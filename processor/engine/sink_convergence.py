"""Convergence of a task's table sinks after a crash (host-neutral; the worker reads the sinks).

A sink that carries a table (``SinkAttrs.carries_table``) must end, per key, with the table's
current row (a tombstone where there is none). A crash breaks that: the records a task sent
after its last commit stay in the topic, the task restarts from the committed state, and its
replay, reading its inputs in another interleaving, may never send the record that would
supersede one of them. So a task that reopens gets, from its host, the **tail** of each table
sink: the last value per key of its own records written after its last commit (the host reads
them by their ``processor.origin`` header, ``processor/runtime/sink_tails.py``), and the
**targets**: per input partition, the offset after the last input record that caused one.

Invariant kept: once the task's positions reach the targets (its replay has processed at least
what the crashed instance had), every key of the tail that the replay has not written again
gets the table's current row sent again if, and only if, the tail's last value differs from
it (compared as bytes, serialized with the sink's serdes). Keys the replay wrote again are
already right: the sink's last record for them is the replay's. Until that step has run, the
host keeps the sink ends of the task's commit records where they were, so a second crash
reads the same tail again (and more).
"""

from __future__ import annotations

import logging

from processor.errors import UserFunctionError
from processor.operators.value_getter import table_getter

log = logging.getLogger("processor.task")


class SinkConvergence:
    def __init__(self, tails: dict[str, dict], targets: dict[tuple[str, int], int]):
        self.tails = {t: dict(keys) for t, keys in tails.items() if keys}   # topic -> {key bytes: last value bytes}
        self.targets = dict(targets)           # (input topic, partition) -> offset to reach
        self.keys = sum(map(len, self.tails.values()))
        self.rewritten_by_replay = 0
        self.sent = 0
        self.unchanged = 0
        self.failed = 0

    def saw(self, records) -> None:
        """Records the task sent: a tail key written again needs no check."""
        tails = self.tails
        for r in records:
            keys = tails.get(r[0])
            if keys is not None and keys.pop(r[1], _MISSING) is not _MISSING:
                self.rewritten_by_replay += 1

    def reached(self, positions) -> bool:
        return all(positions.get(tp, 0) >= off for tp, off in self.targets.items())

    def run(self, task) -> None:
        """Send the table's current row for every tail key whose last value differs from it."""
        ctx = task.context
        sinks = task.topology.table_sinks(task.sub_id)
        send = ctx.send   # (sent by the task once all are checked: _outside_record)
        from processor.provenance import ORIGIN_HEADER

        for topic, keys in self.tails.items():
            if topic not in sinks or not keys:
                continue
            sink, table = sinks[topic]
            getter = table_getter(table, ctx)
            ks, vs = sink.attrs.key_serde, sink.attrs.value_serde
            store_ks = sink.attrs.stream_key_serde
            for kb, last in keys.items():
                key = ks.deserialize(kb)
                skb = kb if store_ks is None or store_ks == ks else store_ks.serialize(key)
                try:
                    row = getter.get(key, skb)
                except UserFunctionError as exc:   # (the row is in the store: processing accepted it)
                    self.failed += 1
                    log.warning("sink convergence: %s[key %r] not checked: %s", topic, kb, exc,
                                extra={"task": task.id})
                    continue
                vb = None if row is None else vs.serialize(row[0])
                if vb == last:
                    self.unchanged += 1
                    continue
                ts = row[1] if row is not None else ctx.wall_clock()
                send(topic, kb, vb, ts, [(ORIGIN_HEADER, ctx.origin())] if ctx.origin_head is not None else None)
                self.sent += 1
        log.info("task %s: table sinks converged after a crash: %d key(s) of the records sent after the last "
                 "commit; %d written again by the replay, %d already equal to the table, %d sent again%s",
                 task.id, self.keys, self.rewritten_by_replay, self.unchanged, self.sent,
                 f", {self.failed} not checked" if self.failed else "", extra={"task": task.id})

    def metrics(self) -> dict[str, int]:
        return {"tail_keys": self.keys, "rewritten_by_replay": self.rewritten_by_replay,
                "resent": self.sent, "already_equal": self.unchanged}


_MISSING = object()
