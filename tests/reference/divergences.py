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
- ``final_results_lost``: under on-window-close emission, Kafka Streams loses the final result
  of a window that has left its store's retention (window size + grace, by the store's clock:
  the largest window start put) before the scan that would emit it, as when stream time skips a
  whole window in one record; this project emits every window once it closes. Each record only
  here must be such a window: its start before the store's clock at that input record - size -
  grace + 1; everything else equal record by record.
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


def rows_by_step(steps: list[tuple], tables: set[str], kip557: bool = True
                 ) -> list[dict[str, dict[bytes, tuple[bytes, int]]]]:
    """Per step, the rows of the table topics ``tables`` AFTER it: ``{topic: {key: (value,
    timestamp)}}``. ``kip557``: as this project keeps them (a no-op update keeps the row's
    timestamp); else as Kafka Streams' ``KTableSource`` does (every update stores its own)."""
    rows: dict[str, dict[bytes, tuple[bytes, int]]] = {t: {} for t in tables}
    out = []
    for s in steps:
        if s[0] in tables and s[1] is not None:
            topic, k, v, ts = s
            before = rows[topic].get(k)
            if v is None:
                rows[topic].pop(k, None)
            elif not kip557 or before is None or before[0] != v:
                rows[topic] = {**rows[topic], k: (v, ts)}
        out.append(dict(rows))
    return out


def row_time(records: list[Record], steps: list[tuple], stamp: Callable) -> list[Record]:
    """Kafka Streams' timestamps checked against ``stamp(record, steps, kip557=False)`` (a record
    whose timestamp that does not explain is left as it is, so the comparison shows it); then
    ``changes``, and each record restamped by ``stamp(record, steps, kip557=True)``."""
    if any(stamp(r, steps, kip557=False) != r[2] for r in records):   # unexplained: the comparison shows it
        return records
    out = []
    for r in changes(records, []):
        ts = stamp(r, steps, kip557=True)
        COUNTS["row_time"] += ts != r[2]
        out.append((r[0], r[1], ts, r[3]))
    return out


def unmatched_timing(theirs: list[Record], ours: list[Record], steps: list[tuple],
                     unmatched: Callable[[bytes | None], tuple[str, bytes] | None],
                     window: tuple[int, int, int]) -> list[Record]:
    """``ours`` if it differs from ``theirs`` only as the rule allows, else ``theirs``.

    - The joined records are equal, record by record.
    - Each unmatched record here is one input record (``unmatched(value)`` gives its side and
      value), used once, forwarded when this project's rule says: at its arrival with its window
      already ended (``ts + look-ahead < stream time``, or a null key), else at the first record
      at stream time after its window closed (``ts + after/before + grace < stream time``).
    - Each of Kafka Streams' unmatched records comes here too, at the same input record or before.
    - An unmatched record only here was matched by a later input record of the other side within
      its window (Kafka Streams, still holding it, dropped it), or Kafka Streams forwarded no
      unmatched record from a scan at or after it (it still held it when the input ended)."""
    before, after, grace = window
    joined_o = [r for r in ours if unmatched(r[1]) is None]
    if [r for r in theirs if unmatched(r[1]) is None] != joined_o:
        return theirs
    stream_time, now = [], -1
    for s in steps:
        if s[0] != "advance" and s[3] >= 0:
            now = max(now, s[3])
        stream_time.append(now)
    used: set[int] = set()

    def arrival(r: Record) -> int | None:
        """The input record an unmatched record ``r`` stands for (earliest unused)."""
        side, v = unmatched(r[1])   # type: ignore[misc]
        for i in range(r[3] + 1):
            s = steps[i]
            if i not in used and s[0] == side and s[1] == r[0] and s[2] == v and s[3] == r[2]:
                used.add(i)
                return i
        return None

    def on_time(r: Record, i: int) -> bool:
        """Forwarded at the step this project's rule names (and no other)."""
        side, _v = unmatched(r[1])   # type: ignore[misc]
        ahead, close = (after, after + grace) if side == "left" else (before, before + grace)
        if r[0] is None or r[2] + ahead < stream_time[i]:
            return r[3] == i                      # at its arrival: its window had ended
        for j in range(i + 1, len(steps)):        # the first record at stream time past its close
            s = steps[j]
            if (s[0] != "advance" and s[1] is not None and s[2] is not None and s[3] == stream_time[j]
                    and stream_time[j] > r[2] + close):
                return r[3] == j
        return False

    def withdrawn(r: Record) -> bool:
        side, v = unmatched(r[1])   # type: ignore[misc]
        other, back, ahead = ("right", before, after) if side == "left" else ("left", after, before)
        return any(s[0] == other and s[1] == r[0] and s[2] is not None and r[2] - back <= s[3] <= r[2] + ahead
                   for s in steps[r[3] + 1:])

    def scanned(r: Record) -> bool:   # Kafka Streams forwarded it from a scan, not at its arrival
        s = steps[r[3]]
        return not (s[0] != "advance" and s[1] == r[0] and s[3] == r[2])

    waiting: dict[tuple, list[int]] = {}     # Kafka Streams' unmatched records -> the steps forwarding them
    for r in theirs:
        if unmatched(r[1]) is not None:
            waiting.setdefault(r[:3], []).append(r[3])
    last_scan = max((r[3] for r in theirs if unmatched(r[1]) is not None and scanned(r)), default=-1)
    earlier = extra = 0
    for o in (r for r in ours if unmatched(r[1]) is not None):
        i = arrival(o)
        if i is None or not on_time(o, i):
            return theirs
        at = waiting.get(o[:3])
        if at and o[3] <= at[0]:
            earlier += o[3] < at.pop(0)
        elif o[3] > last_scan or withdrawn(o):
            extra += 1
        else:
            return theirs
    if any(waiting.values()):
        return theirs
    COUNTS["unmatched_timing"] += earlier + extra
    return ours


def final_results_lost(theirs: list[Record], ours: list[Record], steps: list[tuple], size: int, grace: int
                       ) -> list[Record]:
    """``ours`` if it is ``theirs`` with only lost finals added (the module docstring), else ``theirs``."""
    clock, now = [], -1
    for s in steps:
        if s[0] != "advance" and s[1] is not None:
            now = max(now, s[3] // size * size)
        clock.append(now)
    extra = [r for r in ours if r not in theirs]
    if [r for r in ours if r in theirs] != theirs:
        return theirs
    for r in extra:
        start = int(r[0].decode().rsplit("@", 1)[1].split("-")[0])
        if not start < clock[r[3]] - size - grace + 1:
            return theirs
    COUNTS["final_results_lost"] += len(extra)
    return ours


def apply(names: list[str], records: list[Record], input_ts: list[int]) -> list[Record]:
    for name in names:
        records = RULES[name](records, input_ts)
    return records
