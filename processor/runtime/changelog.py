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

Restoring a task (``restore_task``), before it processes anything:
  1. the task changelog is read from the local checkpoint to partition EOF; records are applied
     in units, each closed by its commit record (a unit with no commit record is a tail);
  2. every store changelog is read from the local checkpoint to partition EOF; records before
     the committed end are applied, those at or after it (a tail) are not;
  3. the result is written locally with the committed ends as the new checkpoint;
  4. each key found in a tail gets its committed value written again by the next commit unit,
     so the tail is overwritten in the changelog too (last write wins, also under compaction),
     and a future restore from any earlier point replays it harmlessly.
A changelog shorter than the local checkpoint says it reflects (recreated topic, another
cluster) is a ``ChangelogMismatch``: the state directory does not belong to these topics.
The end of a changelog partition is found by reading to partition EOF (the fetch high
watermark), never by a latest-offset query. Progress (records restored, rate, remaining) is
logged every few seconds and at the end.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from processor import provenance
from processor.errors import ChangelogMismatch, ConfigError
from processor.state import commit_record
from processor.state.store import TASK_STORE

log = logging.getLogger("processor.restore")

_EOF = KafkaError._PARTITION_EOF
RESTORE_COMMIT_EVERY = 50_000
PROGRESS_EVERY_S = 2.0
STALL_S = 60.0


class ChangelogWriter:
    """Produces one task's commit units to its changelog topics."""

    def __init__(self, task, changelogs: dict[str, str], produce):
        self.task = task
        self.partition = task.partition
        self.changelogs = changelogs         # store name -> changelog topic
        self.produce = produce               # produce(topic, key, value, partition, headers, on_delivery)
        self.db = task.stores
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

    def _on_delivery(self, err, msg):
        self._awaiting -= 1
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
        else:
            self._reported[(msg.topic(), msg.partition())] = msg.offset() + 1

    def has_work(self, positions) -> bool:
        return positions != self._committed_positions or any(s.pending for s in self.db.stores.values())

    def write_pending(self) -> None:
        """Step 1: every pending write of every store, to its changelog."""
        part = self.partition
        header = provenance.HEADER
        encode = provenance.encode
        for name, store in self.db.stores.items():
            if not store.pending:
                continue
            topic = self.changelogs[name]
            writers = store.writers
            items = list(store.pending.items())
            last = len(items) - 1
            for i, (k, v) in enumerate(items):
                w = writers.get(k)
                headers = [(header, encode(w[0], w[1], w[2], 0))] if w else None
                if i == last:
                    self._awaiting += 1
                    self.produce(topic, k, v, part, headers, self._on_delivery)
                else:
                    self.produce(topic, k, v, part, headers, None)
            self.records_written += len(items)

    def write_commit_record(self, positions) -> None:
        """Step 3 (after the host's flush): the commit record, last, to the task changelog."""
        self._check_delivered()
        self.ends.update(self._reported)
        self._reported.clear()
        self.unit += 1
        value = commit_record.encode(commit_record.CommitRecord(self.unit, positions, dict(self.ends)))
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
        return dict(self.ends)

    def _check_delivered(self) -> None:
        if self.errors:
            raise ConfigError(f"task {self.task.id}: {len(self.errors)} changelog record(s) failed "
                              f"delivery, first: {self.errors[0]}")
        if self._awaiting:
            raise ConfigError(f"task {self.task.id}: {self._awaiting} changelog delivery report(s) "
                              f"missing after the flush")


class RestoreStats:
    def __init__(self):
        self.restored = 0
        self.tail_records = 0
        self.seconds = 0.0


def restore_task(db, task_id: str, partition: int, changelogs: dict[str, str], consumer_config: dict,
                 stop=None) -> RestoreStats:
    """Bring ``db`` (a RocksDBDatabase) up to the last durable commit recorded in its changelogs."""
    stats = RestoreStats()
    t0 = time.monotonic()
    local = db.read_checkpoint()
    task_topic = changelogs[TASK_STORE]
    conf = dict(consumer_config)
    conf["auto.offset.reset"] = "error"      # an offset past the end is a mismatch, not "earliest"
    conf["enable.partition.eof"] = True
    conf["fetch.wait.max.ms"] = 50
    consumer = Consumer(conf)
    try:
        reader = _Reader(consumer, task_id, stop)
        task_store = db.store(TASK_STORE)
        # 1. the task changelog, in units closed by commit records
        start = local.get((task_topic, partition), 0)
        unit: dict[bytes, bytes | None] = {}
        last_commit_end = None
        for off, key, value in reader.read({(task_topic, partition): start}):
            if key == commit_record.COMMIT_KEY:
                for k, v in unit.items():
                    _apply(task_store, k, v)
                _apply(task_store, key, value)
                unit.clear()
                last_commit_end = off + 1
            else:
                unit[key] = value
            stats.restored += 1
        task_tail = list(unit)
        raw = task_store.get(commit_record.COMMIT_KEY)
        commit = commit_record.decode(raw) if raw is not None else None
        ends = commit.changelog_ends if commit else {}
        task_end = last_commit_end if last_commit_end is not None else start
        # 2. the store changelogs, each up to its committed end
        stores = {topic: name for name, topic in changelogs.items() if name != TASK_STORE}
        starts = {}
        for topic in stores:
            tp = (topic, partition)
            s, e = local.get(tp, 0), ends.get(tp, 0)
            if s > e:
                raise ChangelogMismatch(
                    f"task {task_id}: local state says it reflects changelog {topic}[{partition}] up to "
                    f"offset {s}, but the last commit recorded in the changelogs ends it at {e}; "
                    f"the state directory does not belong to these topics: delete it to restore")
            starts[tp] = s
        tails: dict[str, list[bytes]] = {}
        total = sum(ends.get(tp, 0) - s for tp, s in starts.items())
        reader.expect(total)
        if total:
            log.info("restoring task %s from its changelogs: %d store records to restore from %d "
                     "changelog(s)", task_id, total, sum(ends.get(tp, 0) > s for tp, s in starts.items()))
        since_commit = 0
        restored_to = dict(starts)
        for (topic, part), off, key, value in reader.read_many(starts):
            tp = (topic, part)
            store = db.store(stores[topic])
            if off < ends.get(tp, 0):
                _apply(store, key, value)
                restored_to[tp] = off + 1
                stats.restored += 1
                since_commit += 1
                if since_commit >= RESTORE_COMMIT_EVERY:   # bounded memory; resumable
                    db.commit({**restored_to, (task_topic, partition): task_end})
                    since_commit = 0
            else:
                tails.setdefault(stores[topic], []).append(key)
                stats.tail_records += 1
        for tp, e in ends.items():
            if tp[0] in stores and reader.eof.get(tp, 0) < e:
                raise ChangelogMismatch(
                    f"task {task_id}: changelog {tp[0]}[{tp[1]}] ends at offset {reader.eof.get(tp, 0)}, "
                    f"but the last commit of this task says it reaches {e}; the changelog was "
                    f"recreated or truncated: delete the state directory and reset the application")
        # 3. the restored state, with the committed ends as its checkpoint
        positions = commit.positions if commit else {k: v for k, v in local.items() if k[0] not in changelogs.values()}
        db.commit({**positions, **{tp: ends.get(tp, 0) for tp in starts}, (task_topic, partition): task_end})
        # 4. tails: write the committed value of their keys again at the next commit
        if task_tail:
            tails.setdefault(TASK_STORE, []).extend(task_tail)
            stats.tail_records += len(task_tail)
        db.writer = (f"__restore:{task_id}", partition, 0)
        for name, keys in tails.items():
            store = db.store(name)
            for k in dict.fromkeys(keys):
                v = store.committed(k)
                if v is None:
                    store.delete(k)
                else:
                    store.put(k, v)
        stats.seconds = time.monotonic() - t0
        if stats.restored or stats.tail_records:
            log.info("restored task %s from its changelogs: %d records in %.1f s (%.0f records/s)%s",
                     task_id, stats.restored, stats.seconds, stats.restored / max(stats.seconds, 1e-6),
                     f"; {stats.tail_records} record(s) of an unfinished commit will be overwritten"
                     if stats.tail_records else "")
        return stats
    finally:
        consumer.close()


def _apply(store, key, value) -> None:
    if value is None:
        store.delete(key)
    else:
        store.put(key, value)


class _Reader:
    """Reads changelog partitions from given offsets to partition EOF, logging progress."""

    def __init__(self, consumer, task_id, stop):
        self.consumer = consumer
        self.task_id = task_id
        self.stop = stop
        self.eof: dict[tuple[str, int], int] = {}
        self.expected = 0

    def expect(self, n: int) -> None:
        self.expected = n

    def read(self, starts):
        for _, off, key, value in self.read_many(starts):
            yield off, key, value

    def read_many(self, starts):
        if not starts:
            return
        c = self.consumer
        c.assign([TopicPartition(t, p, off if off > 0 else OFFSET_BEGINNING) for (t, p), off in starts.items()])
        done: set = set()
        n = 0
        t0 = last_log = last_progress = time.monotonic()
        try:
            while len(done) < len(starts):
                msgs = c.consume(2000, 0.5)
                now = time.monotonic()
                for m in msgs:
                    tp = (m.topic(), m.partition())
                    err = m.error()
                    if err is not None:
                        if err.code() == _EOF:
                            done.add(tp)
                            self.eof[tp] = m.offset()
                            continue
                        if err.code() == KafkaError._AUTO_OFFSET_RESET or err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                            raise ChangelogMismatch(
                                f"task {self.task_id}: local state says it reflects changelog "
                                f"{tp[0]}[{tp[1]}] up to offset {starts.get(tp)}, past the changelog's "
                                f"end ({err.str()}); the changelog was recreated or the state directory "
                                f"belongs to another cluster: delete it to restore")
                        raise ConfigError(f"restoring task {self.task_id} from {tp[0]}[{tp[1]}]: {err.str()}")
                    n += 1
                    last_progress = now
                    yield tp, m.offset(), m.key(), m.value()
                if self.stop is not None and self.stop.is_set():
                    raise RestoreInterrupted()
                if now - last_progress > STALL_S:
                    raise ConfigError(f"restoring task {self.task_id}: no progress for {STALL_S:.0f} s "
                                      f"(partitions not at their end: {sorted(set(starts) - done)})")
                if now - last_log >= PROGRESS_EVERY_S:
                    last_log = now
                    rate = n / max(now - t0, 1e-6)
                    remaining = max(self.expected - n, 0) if self.expected else "?"
                    log.info("restoring task %s: %d records restored, %.0f records/s, %s remaining",
                             self.task_id, n, rate, remaining)
        finally:
            c.unassign()


class RestoreInterrupted(Exception):
    """A stop was requested during a restore (progress up to the last intermediate commit is kept)."""
