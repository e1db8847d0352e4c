"""The documented divergences from Kafka Streams, each as a rule applied to Kafka Streams' output
to give what this project must output (docs/reference.md lists them with Kafka Streams' source
line, the rule, its reason and the test that pins each).

A twin names the divergences that apply to each of its outputs; the suite applies them to the
reference's records and then demands equality, record by record. A difference no rule explains
fails the suite. Each rule counts the records it changed, for the closing report.

- ``changes``: a table's output carries its net change per input record, and only real changes
  (the seeds: KAFKA-3902's filter, KIP-557's emit on change, "no tombstone for a key that has
  no result"). Per input record, only the last update of a key counts; an update whose value
  bytes equal the key's last forwarded value (a tombstone of a key with none) is dropped.
- ``changes_ts``: ``changes``, with KIP-557's timestamp: a dropped no-op does not advance the
  result's timestamp, so an aggregate's next change is stamped ``max(its input's timestamp,
  the last forwarded timestamp)``, where Kafka Streams' max also counts the no-ops it stored.
- ``session_rewrite``: a session whose bounds a record does not change is not tombstoned
  before its new value (Kafka Streams removes and re-puts it: ``KStreamSessionWindowAggregate``).
- ``row_time``: ``changes``, with KIP-557's timestamp at the table sources: a no-op update does
  not move a row's timestamp here, where Kafka Streams stores the update's timestamp; a join
  result is stamped from the rows' timestamps, so the twin recomputes each result's timestamp
  from the rows as this rule keeps them (``Twin.row_time``).
- ``unmatched_timing``: a left/outer stream-stream join forwards an unmatched record at the
  first record at stream time after its window closed. Kafka Streams may forward it later: it
  scans its outer store only when the smallest timestamp it noted since its last scan is past
  the window (``KStreamKStreamJoin.emitNonJoinedOuterRecords``: ``minTime``, which its scan sets
  to the last record it passed, not the smallest), and at most once per wall-clock interval. The
  joined records must be equal record by record; each of Kafka Streams' unmatched ones comes here
  too, at the same input record or an earlier one; an unmatched record only here
  must have been matched by a later record (Kafka Streams, still holding it, dropped it then: the
  spurious result it avoided by waiting), or held still when the input ended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

Record = tuple[bytes | None, bytes | None, int, int]   # key, value, timestamp, step

COUNTS: Counter[str] = Counter()   # records changed per rule over the run


def _net_per_step(records: list[Record]) -> list[Record]:
    last: dict[tuple[int, bytes | None], int] = {}
    for i, (k, _v, _ts, step) in enumerate(records):
        last[(step, k)] = i
    return [r for i, r in enumerate(records) if last[(r[3], r[0])] == i]


def changes(records: list[Record], input_ts: list[int]) -> list[Record]:
    kept: list[Record] = []
    emitted: dict[bytes | None, bytes | None] = {}
    for r in _net_per_step(records):
        if emitted.get(r[0]) != r[1]:
            emitted[r[0]] = r[1]
            kept.append(r)
    COUNTS["changes"] += len(records) - len(kept)
    return kept


def changes_ts(records: list[Record], input_ts: list[int]) -> list[Record]:
    kept: list[Record] = []
    emitted: dict[bytes | None, tuple[bytes | None, int]] = {}
    restamped = 0
    for k, v, ts, step in _net_per_step(records):
        before = emitted.get(k)
        if before is not None and before[0] == v:
            continue
        stamp = input_ts[step] if before is None else max(input_ts[step], before[1])
        restamped += stamp != ts
        emitted[k] = (v, stamp)
        kept.append((k, v, stamp, step))
    COUNTS["changes"] += len(records) - len(kept)
    COUNTS["changes_ts"] += restamped
    return kept


def session_rewrite(records: list[Record], input_ts: list[int]) -> list[Record]:
    out = [r for i, r in enumerate(records)
           if not (r[1] is None and i + 1 < len(records) and records[i + 1][0] == r[0]
                   and records[i + 1][3] == r[3] and records[i + 1][1] is not None)]
    COUNTS["session_rewrite"] += len(records) - len(out)
    return out


RULES: dict[str, Callable[[list[Record], list[int]], list[Record]]] = {
    "changes": changes, "changes_ts": changes_ts, "session_rewrite": session_rewrite,
}


def rows_by_step(steps: list[tuple], tables: set[str]) -> list[dict[str, dict[bytes, tuple[bytes, int]]]]:
    """Per step, the rows of the table topics ``tables`` AFTER it, as this project keeps them:
    ``{topic: {key: (value, timestamp)}}``; a no-op update keeps the row's timestamp (KIP-557)."""
    rows: dict[str, dict[bytes, tuple[bytes, int]]] = {t: {} for t in tables}
    out = []
    for s in steps:
        if s[0] in tables and s[1] is not None:
            topic, k, v, ts = s
            before = rows[topic].get(k)
            if v is None:
                rows[topic].pop(k, None)
            elif before is None or before[0] != v:
                rows[topic] = {**rows[topic], k: (v, ts)}
        out.append(dict(rows))
    return out


def row_time(records: list[Record], steps: list[tuple], stamp: Callable) -> list[Record]:
    """``changes``, then each record restamped by ``stamp(record, steps)``."""
    out = []
    for r in changes(records, []):
        ts = stamp(r, steps)
        COUNTS["row_time"] += ts != r[2]
        out.append((r[0], r[1], ts, r[3]))
    return out


def unmatched_timing(theirs: list[Record], ours: list[Record], unmatched: Callable[[bytes | None], bool],
                     matched_later: Callable[[Record, Record], bool], steps: list[tuple]) -> list[Record]:
    """``ours`` if it differs from ``theirs`` only as the rule allows, else ``theirs``: the joined
    records equal; each of Kafka Streams' unmatched records forwarded here too, at the same input
    record or before (their order among themselves follows when each was forwarded); each
    unmatched record only here one that a later record
    matched (``matched_later(unmatched, joined)``), which Kafka Streams, still holding it, withdrew,
    or one Kafka Streams still held when the input ended (no scan of its outer store forwarded
    anything from that input record on: a scan would have forwarded it)."""
    joined_t = [r for r in theirs if not unmatched(r[1])]
    joined_o = [r for r in ours if not unmatched(r[1])]
    if joined_t != joined_o:
        return theirs
    waiting: dict[tuple, list[int]] = {}     # Kafka Streams' unmatched records -> the steps forwarding them
    for r in theirs:
        if unmatched(r[1]):
            waiting.setdefault(r[:3], []).append(r[3])
    def scanned(r: Record) -> bool:   # forwarded by a scan, not at its own arrival
        s = steps[r[3]]
        return not (s[0] != "advance" and s[1] == r[0] and s[3] == r[2])
    last_scan = max((r[3] for r in theirs if unmatched(r[1]) and scanned(r)), default=-1)
    earlier = extra = 0
    for o in (r for r in ours if unmatched(r[1])):
        steps = waiting.get(o[:3])
        if steps and o[3] <= steps[0]:
            earlier += o[3] < steps.pop(0)
        elif o[3] > last_scan or any(j[3] > o[3] and matched_later(o, j) for j in joined_o):
            extra += 1
        else:
            return theirs
    if any(waiting.values()):
        return theirs
    COUNTS["unmatched_timing"] += earlier + extra
    return ours


def apply(names: list[str], records: list[Record], input_ts: list[int]) -> list[Record]:
    for name in names:
        records = RULES[name](records, input_ts)
    return records
