"""Changelog topics: every store of a task is mirrored to ``<application-id>-<store>-changelog``
(the task store to ``<application-id>-__task-<sub>-changelog``), partition = the task's partition.

Invariant: the changelogs up to the end offsets named in a task's last durable commit record
(``processor/state/commit_record.py``) hold exactly the task's state as of that commit, and the
commit record holds the input positions of that state. So a task can be rebuilt anywhere from
the changelogs alone, and it resumes its inputs from those positions: nothing is applied twice
and nothing is lost, whatever the broker does with records of unfinished commits.

Writing one commit unit (``ChangelogWriter``; the worker drives it):
  1. the task's pending writes (its write buffer: one value per key written since the last
     commit) go to the changelogs, each record keyed by the store key, valued by the stored
     bytes (tombstone for a delete), with a ``processor.source`` header naming the input record
     that wrote it last; delivery reports give each changelog partition's new end offset;
  2. the host flushes: outputs, internal records and changelog records are durable;
  3. the commit record (positions + every end offset) goes to the task changelog, last; flush;
  4. (the host commits the group offsets, or the transaction), then the task writes its state,
     positions, end offsets and the commit record to RocksDB as one batch.
A crash before 3 leaves changelog records past the committed ends ("uncommitted tails").

Restoring a task from them (and keeping a standby replica up to date) is the read side:
``processor/runtime/changelog_reader.py``.
"""

from __future__ import annotations

import logging
import time

from processor import provenance
from processor.errors import KafkaIOError
from processor.state import commit_record
from processor.state.store import TASK_STORE

log = logging.getLogger("processor.restore")


class ChangelogWriter:
    """Produces one task's commit units to its changelog topics; the task's stores are
    ``ChangeLoggingStores`` (``processor/state/change_logging.py``) around its database."""

    def __init__(self, task, changelogs: dict[str, str], produce, produce_records):
        self.task = task
        self.partition = task.partition
        self.changelogs = changelogs         # store name -> changelog topic
        self.produce = produce               # produce(topic, key, value, partition, headers, on_delivery)
        # produce_records(topic, partition, [(key, value, headers)...], on_delivery of the last)
        self.produce_records = produce_records
        self._topic_bytes: dict[str, bytes] = {}   # provenance headers: source topic -> UTF-8
        self.db = task.stores                # ChangeLoggingStores
        raw = self.db.store(TASK_STORE).get(commit_record.COMMIT_KEY)
        last = commit_record.decode(raw) if raw is not None else None
        self.unit = last.unit if last else 0
        local = self.db.read_checkpoint()
        self.ends = {(t, self.partition): local.get((t, self.partition), 0) for t in changelogs.values()}
        self._reported: dict[tuple[str, int], int] = {}
        self._awaiting = 0
        self.errors: list[str] = []
        self.records_written = 0
        self._committed_positions = dict(task.positions)
        # table sinks (processor/runtime/sink_tails.py): the ends the last commit record named
        # (None: it named none), the partitions to name, their ends when the task opened
        self.sink_ends: dict | None = last.sink_ends if last else None
        self.sink_partitions: list = []
        self.sink_floor: dict = {}
        self.has_commit = last is not None
        self.last_commit_at = time.monotonic()

    def settle_sink_ends(self, delivered: dict, pending: bool) -> None:
        """After the unit's flush: the sink ends this unit's commit record names (kept where they
        were while the task's sink convergence is ``pending``)."""
        if not self.sink_partitions or (pending and self.sink_ends is not None):
            return
        cur = self.sink_ends or {}
        floor = self.sink_floor
        self.sink_ends = {tp: max(cur.get(tp, 0), floor.get(tp, 0), delivered.get(tp, 0))
                          for tp in self.sink_partitions}

    def sink_ends_stale(self, delivered: dict, now: float, after_s: float) -> bool:
        """An idle task's commit record is old and the sinks moved on: a fresh one saves the
        next owner reading the others' records since."""
        if not self.sink_partitions or now - self.last_commit_at < after_s:
            return False
        cur = self.sink_ends or {}
        floor = self.sink_floor
        return any(max(delivered.get(tp, 0), floor.get(tp, 0)) > cur.get(tp, 0) for tp in self.sink_partitions)

    def _on_delivery(self, err, msg):
        self._awaiting -= 1
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
        else:
            self._reported[(msg.topic(), msg.partition())] = msg.offset() + 1

    def has_work(self, positions) -> bool:
        return (positions != self._committed_positions or (self.sink_ends is None and bool(self.sink_partitions))
                or self.db.has_changes())

    def write_pending(self) -> None:
        """Step 1: every store's changes since the last commit, to its changelog."""
        header = provenance.HEADER
        pack = provenance.pack_head
        version = provenance.VERSION
        topics = self._topic_bytes
        for name, store in self.db.stores.items():
            if not store.changes:
                continue
            records: list[tuple] = []
            append = records.append
            for k, v, w in store.changed():
                if w is None:
                    append((k, v, None))
                else:
                    tb = topics.get(w[0])
                    if tb is None:
                        tb = topics[w[0]] = w[0].encode("utf-8")
                    append((k, v, [(header, pack(version, w[1], w[2], 0) + tb)]))
            self._awaiting += 1
            self.produce_records(self.changelogs[name], self.partition, records, self._on_delivery)
            self.records_written += len(records)

    def write_commit_record(self, positions) -> None:
        """Step 3 (after the host's flush): the commit record, last, to the task changelog."""
        self._check_delivered()
        self.ends.update(self._reported)
        self._reported.clear()
        self.unit += 1
        value = commit_record.encode(commit_record.CommitRecord(
            self.unit, positions, dict(self.ends), dict(self.sink_ends) if self.sink_partitions and
            self.sink_ends is not None else None))
        task_store = self.db.store(TASK_STORE)
        task_store.put(commit_record.COMMIT_KEY, value)
        self._awaiting += 1
        self.produce(self.changelogs[TASK_STORE], commit_record.COMMIT_KEY, value, self.partition,
                     None, self._on_delivery)

    def committed_ends(self, positions) -> dict[tuple[str, int], int]:
        """After the host's second flush: every changelog end offset, for the local checkpoint."""
        self._check_delivered()
        self.ends.update(self._reported)
        self._reported.clear()
        self._committed_positions = dict(positions)
        self.has_commit = True
        self.last_commit_at = time.monotonic()
        return dict(self.ends)

    def _check_delivered(self) -> None:
        if self.errors:
            raise KafkaIOError(f"task {self.task.id}: {len(self.errors)} changelog record(s) failed "
                              f"delivery, first: {self.errors[0]}")
        if self._awaiting:
            raise KafkaIOError(f"task {self.task.id}: {self._awaiting} changelog delivery report(s) "
                              f"missing after the flush")
