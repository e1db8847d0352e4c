"""The restore side of the changelogs: a task's database brought up to its changelogs' last commit.

The write side, and the invariant both keep, are ``processor/runtime/changelog.py``.

Restoring a task (``restore_steps``, every task of an assignment at once), before it processes anything:
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
watermark, ``processor/kafka/read_to_end.py``: ``PartitionsToEnd``), never by a latest-offset
query. Progress (records restored, rate, remaining) is logged every few seconds and at the end.

``ChangelogReader`` (Kafka Streams' ``StoreChangelogReader``) is one worker's restore consumer:
its task manager's restores (a new assignment's, the rebuild after an aborted transaction) and
its standby replicas' passes all read through it, opened once and kept open (a take-over from an
up-to-date standby reads nothing, and no longer waits for a new consumer to connect). Invariant:
reads take turns on its consumer, between two batches; a read that finds the consumer was used by
another read since its last batch assigns its own partitions again, each where it is, so the
main loop may interleave them (a restore starting while a standby pass is partway).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar, cast

from confluent_kafka import Consumer, KafkaError

from processor.engine.task_id import TaskId
from processor.errors import ChangelogMismatch, KafkaIOError
from processor.kafka import clients as kafka
from processor.kafka.read_to_end import PartitionsToEnd
from processor.state import commit_record, source_changelog
from processor.state.change_logging import ChangeLoggingStores
from processor.state.store import TASK_STORE

log = logging.getLogger("processor.restore")

RESTORE_COMMIT_EVERY = 50_000
PROGRESS_EVERY_S = 2.0
SILENT_S = 3.0     # a partition silent this long: check that its start is not past its end
STALL_S = 60.0
_E = TypeVar("_E", bound=Exception)


def restore_consumer_settings(consumer_config: dict) -> dict:
    """The settings of a consumer that restores task stores, from the host's ``consumer_config``."""
    conf = dict(consumer_config)
    conf["auto.offset.reset"] = "error"      # an offset past the end is a mismatch, not "earliest"
    conf["enable.partition.eof"] = True
    # (short waits: a fresh application's changelogs are empty, and each phase's partitions
    # report their end only after a fetch that finds nothing; at 50 ms here and in consume()
    # below, the two phases of four empty tasks took 0.3 s before the first record, now 0.12 s)
    conf["fetch.wait.max.ms"] = 10
    return conf


class ChangelogReader:
    """One worker's restore consumer and the restores that read through it (see the module
    docstring). ``consumer_config``: the host's settings for it (``restore_consumer_settings``
    makes them a restore's); ``stop``: a set event ends a restore at its next batch
    (``RestoreInterrupted``); ``consumer``: one to read through instead of opening one."""

    def __init__(self, consumer_config: dict, stop: threading.Event | None = None,
                 consumer: Consumer | None = None) -> None:
        self.settings = restore_consumer_settings(consumer_config)
        self.stop = stop
        self._consumer = consumer
        self.consumers_opened = 0
        # the read the consumer is assigned to now (``_Reader.read_many``), if any
        self.reading: Any = None

    @property
    def consumer(self) -> Consumer:
        """The consumer, opened at its first use and kept open."""
        if self._consumer is None:
            self._consumer = kafka.new_consumer(self.settings, "restoring task stores")
            self.consumers_opened += 1
        return self._consumer

    def restore_steps(self, targets: list[RestoreTarget], quiet: bool = False) -> Generator[None, None, None]:
        """``restore_steps`` of ``targets`` through this reader."""
        return restore_steps(targets, self, quiet)

    def restore(self, targets: list[RestoreTarget]) -> None:
        """Bring each target's database up to the last durable commit recorded in its changelogs,
        here and now (all targets at once)."""
        for _ in restore_steps(targets, self):
            pass

    def reset(self) -> None:
        """Close the consumer (a read failed for no one task: the next read opens a new one)."""
        consumer, self._consumer, self.reading = self._consumer, None, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:
                log.debug("closing the restore consumer: %s", exc)

    def close(self) -> None:
        self.reset()


class RestoreTarget:
    """One task database to restore, and what the restore found."""

    def __init__(self, db, task_id: str, partition: int, changelogs: dict[str, str],
                 sources: dict[str, str] | None = None, table_sources: dict[str, str] | None = None,
                 former_changelogs: dict[str, str] | None = None):
        self.db = db
        self.task_id = task_id
        self.partition = partition
        self.changelogs = changelogs
        self.sources = sources or {}     # store -> its source topic, its changelog (phase 3)
        # every store of a table read from a user topic -> that topic: one whose changelog the
        # last commit does not cover (it was reused then) is restored from the topic too
        self.table_sources = {**(table_sources or {}), **self.sources}
        self.from_sources: dict[str, str] = dict(self.sources)   # what phase 3 restores
        self.source_ends: dict = {}
        # reused store -> the changelog it had without ``reuse_source_topics`` (its base, if it
        # ran so before: ``source_changelog.read_base``); phase 3 starts at the base's position
        self.former_changelogs = former_changelogs or {}
        self.source_floor: dict[str, int] = {}
        self.new_bases: dict[str, bytes] = {}
        # stores with a changelog the last commit names no end for (see restore_steps, phase 2),
        # and where such a changelog's records are applied from (read: from its start)
        self.uncovered: set[str] = set()
        self.apply_from: dict = {}
        # reused stores given a new base now -> keys of their former changelog past its end;
        # stores whose base (and its overlay) the restore went through
        self.base_tails: dict[str, list] = {}
        self.base_overlay: set[str] = set()
        self.task_tp = (changelogs[TASK_STORE], partition)
        self.local = db.read_checkpoint()
        self.restored = 0
        self.tail_records = 0
        # store changelog records to apply / applied (known once the task changelog was read)
        self.to_restore: int | None = None
        self.store_restored = 0
        # filled in by the restore
        self._unit: dict[bytes, bytes | None] = {}
        self._last_commit_end: int | None = None
        self.commit: commit_record.CommitRecord | None = None
        self.ends: dict = {}
        self.task_end = 0
        self.starts: dict = {}
        self.restored_to: dict = {}
        self.tails: dict[str, list[bytes]] = {}
        # the task's view of the database: writes through it go to the changelog at the next
        # commit (the restore itself writes to ``db``, which logs nothing)
        self.stores = ChangeLoggingStores(db, unlogged=self.sources)


def restore_target(topology, db, sub: int, partition: int) -> RestoreTarget:
    """The ``RestoreTarget`` of task ``sub_partition`` of ``topology`` over its database ``db``
    (an active task's and a standby replica's alike)."""
    return RestoreTarget(db, str(TaskId(sub, partition)), partition, topology.changelogs_of(sub),
                         topology.source_changelogs_of(sub), topology.table_source_stores_of(sub),
                         {name: topology.changelog_topic(name) for name in topology.source_changelogs_of(sub)})


def restore_steps(targets: list[RestoreTarget], changelog_reader: ChangelogReader, quiet: bool = False):
    """The restore of ``targets`` (see the module docstring) in steps: a generator that yields after
    each batch it read (a few thousand records at most), so a host can restore between polls of
    its group consumer (``processor/runtime/worker.py``). Closing it stops the restore (progress
    up to the last intermediate commit is kept). ``quiet``: progress and results at debug level
    (standby replicas restore every second: ``processor/runtime/standby.py``). It reads through
    ``changelog_reader``'s consumer."""
    if not targets:
        return
    t0 = time.monotonic()
    conf = changelog_reader.settings
    stop = changelog_reader.stop
    names = {}
    for t in targets:
        names[t.task_tp] = t.task_id
        for topic in (*t.changelogs.values(), *t.table_sources.values(), *t.former_changelogs.values()):
            names[(topic, t.partition)] = t.task_id
    reader = _Reader(changelog_reader, names, stop, conf)
    reader.quiet = quiet
    # 1. the task changelogs, in units closed by commit records
    by_task_tp = {t.task_tp: t for t in targets}
    starts = {t.task_tp: t.local.get(t.task_tp, 0) for t in targets}
    for item in reader.read_many(starts):
        if item is None:
            yield
            continue
        tp, off, key, value, _ = item
        t = by_task_tp[tp]
        if key == commit_record.COMMIT_KEY:
            task_store = t.db.store(TASK_STORE)
            for k, v in t._unit.items():
                _apply(task_store, k, v)
            _apply(task_store, key, value)
            t._unit.clear()
            t._last_commit_end = off + 1
        else:
            t._unit[key] = value
        t.restored += 1
    # 2. the store changelogs, each up to its committed end
    by_store_tp = {}
    for t in targets:
        raw = t.db.store(TASK_STORE).get(commit_record.COMMIT_KEY)
        t.commit = commit_record.decode(raw) if raw is not None else None
        t.ends = t.commit.changelog_ends if t.commit else {}
        t.task_end = t._last_commit_end if t._last_commit_end is not None else starts[t.task_tp]
        for name, topic in t.changelogs.items():
            if name == TASK_STORE:
                continue
            tp = (topic, t.partition)
            s, e = t.local.get(tp, 0), t.ends.get(tp, 0)
            if t.commit is not None and tp not in t.ends:
                # the last commit names no end for this changelog: the store had none then
                # (its source topic was its changelog: ``reuse_source_topics`` since turned
                # off). Its rows come from the source topic (phase 3), from a base where it
                # has one; every record the changelog holds is overwritten at the next
                # commit, which writes the whole store (``_finish``).
                # (read from its start: each key it holds becomes a tail; applied, where a
                # base says so, from the local position to the base's end)
                t.uncovered.add(name)
                s = 0
                if name in t.table_sources:
                    t.from_sources[name] = t.table_sources[name]
                    t.apply_from[tp] = _base_of_uncovered(t, name, tp)
                    e = t.ends.get(tp, 0)
                    if t.apply_from[tp] > e:
                        raise _local_past_end(t, topic, t.apply_from[tp], e, store=name)
            if s > e:
                raise _local_past_end(t, topic, s, e)
            t.starts[tp] = s
            by_store_tp[tp] = (t, name)
        _former_changelogs(t, by_store_tp)
        t.restored_to = {tp: max(s, t.apply_from.get(tp, 0)) for tp, s in t.starts.items()}
    store_starts = {tp: t.starts[tp] for tp, (t, _) in by_store_tp.items()}

    def to_apply(t, tp):
        return max(t.ends.get(tp, 0) - max(t.starts[tp], t.apply_from.get(tp, 0)), 0)
    total = sum(to_apply(t, tp) for tp, (t, _) in by_store_tp.items())
    reader.expect(total)
    for t in targets:
        t.to_restore = sum(to_apply(t, tp) for tp in t.starts)
    reader.detail = lambda: ", ".join(f"{t.task_id} {t.store_restored}/{t.to_restore}" for t in targets
                                      if t.to_restore)
    if total:
        log.log(logging.DEBUG if quiet else logging.INFO,
                "restoring %d task(s) from their changelogs: %d store records to restore", len(targets), total)
    since_commit = 0
    for item in reader.read_many(store_starts):
        if item is None:
            yield
            continue
        tp, off, key, value, _ = item
        t, name = by_store_tp[tp]
        if off < t.ends.get(tp, 0):
            if name in t.uncovered:     # written again at the next commit, with the row then
                t.tails.setdefault(name, []).append(key)
                if off < t.apply_from.get(tp, 0):
                    continue
            _apply(t.db.store(name), key, value)
            t.restored_to[tp] = off + 1
            t.restored += 1
            t.store_restored += 1
            since_commit += 1
            if since_commit >= RESTORE_COMMIT_EVERY:   # bounded memory; resumable
                for x in targets:
                    x.db.commit({**x.restored_to, x.task_tp: x.task_end})
                since_commit = 0
        elif name in t.base_tails:    # a reused store's former changelog, past the new base
            t.base_tails[name].append(key)
        elif name not in t.sources:   # (a reused store's former changelog: no longer written)
            t.tails.setdefault(name, []).append(key)
            t.tail_records += 1
    for tp, (t, _) in by_store_tp.items():
        e = t.ends.get(tp, 0)
        if reader.eof.get(tp, 0) < e:
            raise _of_task(ChangelogMismatch(
                f"task {t.task_id}: changelog {tp[0]}[{tp[1]}] ends at offset {reader.eof.get(tp, 0)}, "
                f"but the last commit of this task says it reaches {e}; the changelog was "
                f"recreated or truncated: delete the state directory and reset the application"), t.task_id)
    for t in targets:    # a base's overlay, after its changelog (source_changelog docstring)
        for name in t.base_overlay:
            store = t.db.store(name)
            for k, row in source_changelog.base_rows(t.db.store(TASK_STORE), name):
                source_changelog.restore_row(store, k, row)
    # 3. stores whose changelog is their source topic, up to the committed position
    yield from _restore_from_sources(targets, reader)
    seconds = time.monotonic() - t0
    for t in targets:
        _finish(t, seconds, quiet)


def _local_past_end(t: RestoreTarget, topic: str, at: int, end: int, store: str | None = None):
    """The mismatch when local state says it reflects changelog ``topic`` past ``end``: the end
    the last commit gives it, or, with ``store``, the end that store was restored to."""
    where = (f"store {store} was restored from it up to {end} only" if store is not None
             else f"the last commit recorded in the changelogs ends it at {end}")
    return _of_task(ChangelogMismatch(
        f"task {t.task_id}: local state says it reflects changelog {topic}[{t.partition}] up to offset {at}, "
        f"but {where}; the state directory does not belong to these topics: delete it to restore"), t.task_id)


def _of_task(exc: _E, task_id: str | None) -> _E:
    """``exc``, naming the task it concerns as ``exc.task_id`` (a standby pass sets that task's
    replica aside and goes on with the others: ``processor/runtime/standby.py``)."""
    exc.task_id = task_id   # type: ignore[attr-defined]
    return exc


def _base_of_uncovered(t: RestoreTarget, name: str, tp) -> int:
    """Phase 2 for a store whose changelog the last commit does not cover, with a base entry from
    when its source topic was its changelog: a local state from before the base's source
    position is brought up to it from the changelog (up to the base's end: records of the
    period before the source topic took over); returns where to apply the changelog from (0,
    and the base's end 0, without a base or where the local state is past it)."""
    base = source_changelog.read_base(t.db.store(TASK_STORE), name)
    if base is None or base[0] != tp[0]:
        return 0
    _, end, position = base
    t.source_floor[name] = position
    if t.local.get((t.table_sources[name], t.partition), 0) >= position:
        return 0
    t.base_overlay.add(name)
    t.ends[tp] = end
    return t.local.get(tp, 0)


def _former_changelogs(t: RestoreTarget, by_store_tp: dict) -> None:
    """Phase 2 for a reused store with a base (``source_changelog`` module docstring): the last
    commit named its changelog (the option was turned on since: the base is that commit's), or a
    base entry says so. A local state from before the base's source position P is brought up to
    it from the former changelog; the source topic is read from P on (phase 3)."""
    for name, topic in t.former_changelogs.items():
        tp = (topic, t.partition)
        src = (t.sources[name], t.partition)
        if t.commit is not None and tp in t.ends:
            # turned on since the last commit: a new base. The changelog is applied up to its end
            # where the local state is behind, and read past it in any case: the keys of records
            # there get their rows at P kept beside the base (its overlay, written by _finish)
            end, position = t.ends[tp], t.commit.positions.get(src, 0)
            t.new_bases[name] = source_changelog.encode_base(topic, end, position)
            t.base_tails[name] = []
            t.source_floor[name] = position
            s = t.local.get(tp, 0) if t.local.get(src, 0) < position else end
            if s > end:
                raise _local_past_end(t, topic, s, end)
            t.starts[tp] = s
            by_store_tp[tp] = (t, name)
            continue
        else:
            base = source_changelog.read_base(t.db.store(TASK_STORE), name)
            if base is None:
                continue
            topic, end, position = base
            tp = (topic, t.partition)
        t.source_floor[name] = position
        if t.local.get(src, 0) >= position:
            continue
        t.base_overlay.add(name)
        s = t.local.get(tp, 0)
        if s > end:
            raise _local_past_end(t, topic, s, end, store=name)
        t.ends[tp] = end
        t.starts[tp] = s
        by_store_tp[tp] = (t, name)


def _restore_from_sources(targets: list[RestoreTarget], reader: _Reader):
    """Phase 3 of ``restore_steps``: each store whose changelog is its table's source topic
    (``processor/state/source_changelog.py``) gets the topic's records from the local checkpoint's
    position (or a base's) to the committed one, through the table source's own update rule;
    at the offsets the task rejected (its task store, restored in phase 1, names them) the row
    the key had is put back instead (``source_changelog.replay_record``)."""
    readers: dict[tuple[str, int], list] = {}      # source tp -> [(target, store)]
    starts, ends = {}, {}
    for t in targets:
        if not t.from_sources:
            continue
        committed: dict[tuple[str, int], int] = t.commit.positions if t.commit else {}
        for name, topic in t.from_sources.items():
            tp = (topic, t.partition)
            s, e = max(t.local.get(tp, 0), t.source_floor.get(name, 0)), committed.get(tp, 0)
            if s > e:
                raise _of_task(ChangelogMismatch(
                    f"task {t.task_id}: local state says store {name} reflects its source topic "
                    f"{topic}[{t.partition}] up to offset {s}, but the last commit recorded in the "
                    f"changelogs ends it at {e}; the state directory does not belong to these topics: "
                    f"delete it to restore"), t.task_id)
            if e > s:
                readers.setdefault(tp, []).append((t, name))
                starts[tp], ends[tp] = s, e
                t.source_ends[tp] = e
                t.to_restore = (t.to_restore or 0) + e - s
    if not readers:
        return
    failed = {tp: source_changelog.failed_records(t.db.store(TASK_STORE), tp[0], tp[1])
              for tp, ts in readers.items() for t in [ts[0][0]]}
    total = sum(ends[tp] - starts[tp] for tp in readers)
    reader.expect(total)
    log.log(logging.DEBUG if reader.quiet else logging.INFO,
            "restoring %d store(s) from their source topics: up to %d records to read",
            sum(len(v) for v in readers.values()), total)
    replay = source_changelog.replay_record
    since_commit = 0
    for item in reader.read_many(starts, ends):
        if item is None:
            yield
            continue
        tp, off, key, value, ts = item
        rejected = failed[tp]
        for t, name in readers[tp]:
            replay(t.db.store(name), rejected, off, key, value, ts)
            t.restored_to[tp] = off + 1
            t.restored += 1
            t.store_restored += 1
        since_commit += 1
        if since_commit >= RESTORE_COMMIT_EVERY:   # bounded memory; resumable from the local position
            for x in targets:
                x.db.commit({**x.restored_to, x.task_tp: x.task_end})
            since_commit = 0
    for tp, end in ends.items():
        eof = reader.eof.get(tp)
        if eof is not None and eof < end:
            t = readers[tp][0][0]
            raise _of_task(ChangelogMismatch(
                f"task {t.task_id}: source topic {tp[0]}[{tp[1]}] ends at offset {eof}, but the last "
                f"commit of this task says its table reflects it up to {end}; the topic was recreated "
                f"or truncated: delete the state directory and reset the application"), t.task_id)


def _finish(t: RestoreTarget, seconds: float, quiet: bool = False) -> None:
    db = t.db
    # 3. the restored state, with the committed ends as its checkpoint
    cl = set(t.changelogs.values())
    positions = t.commit.positions if t.commit else {k: v for k, v in t.local.items() if k[0] not in cl}
    db.commit({**positions, **{tp: t.ends.get(tp, 0) for tp in t.starts}, t.task_tp: t.task_end})
    # 4. tails: write the committed value of their keys again at the next commit
    if t._unit:
        t.tails.setdefault(TASK_STORE, []).extend(t._unit)
        t.tail_records += len(t._unit)
    # a store with local contents that the last commit names no changelog end for (it was
    # restored from its source topic then: ``reuse_source_topics`` turned off since): all of it
    # goes to its changelog at the next commit, which from then on holds its state
    for name in t.uncovered:
        keys = [k for k, _ in db.store(name).items()]
        if keys:
            log.log(logging.DEBUG if quiet else logging.INFO,
                    "task %s: store %s has no changelog records of its last commit: its %d keys go to "
                    "%s at the next commit", t.task_id, name, len(keys), t.changelogs[name])
            t.tails.setdefault(name, []).extend(keys)
    t.stores.writer = (f"__restore:{t.task_id}", t.partition, 0)
    for name, keys in t.tails.items():
        committed = db.store(name).committed
        store = t.stores.store(name)
        for k in dict.fromkeys(keys):
            v = committed(k)
            if v is None:
                store.delete(k)
            else:
                store.put(k, v)
    # (after the tails: a base key in the task changelog's unfinished unit must not undo it)
    task_store = t.stores.store(TASK_STORE)
    for name, value in t.new_bases.items():
        overlay = dict.fromkeys(t.base_tails.get(name, ()))
        log.log(logging.DEBUG if quiet else logging.INFO,
                "task %s: store %s is restored from its source topic from now on; its base is its "
                "changelog up to the last commit%s", t.task_id, name,
                f" and the rows of the {len(overlay)} key(s) of its unfinished unit" if overlay else "")
        for k, _ in list(task_store.prefix(source_changelog.base_row_key(name, b""))):
            if k not in overlay:
                task_store.delete(k)
        rows = db.store(name)
        for k in overlay:
            task_store.put(source_changelog.base_row_key(name, k), source_changelog.encode_failed(rows.get(k)))
        task_store.put(source_changelog.base_key(name), value)
    if (t.restored or t.tail_records or t.local) and not quiet:   # (reopened from local state: even with 0)
        log.info("restored task %s from its changelogs: %d records (the assignment's restore took %.1f s)%s",
                 t.task_id, t.restored, seconds,
                 f"; {t.tail_records} record(s) of an unfinished commit will be overwritten"
                 if t.tail_records else "")


def _apply(store, key, value) -> None:
    if value is None:
        store.delete(key)
    else:
        store.put(key, value)


class _Reader:
    """One restore's reads: changelog partitions from given offsets to their ends
    (``PartitionsToEnd``), through the ``ChangelogReader``'s consumer, logging progress."""

    def __init__(self, owner: ChangelogReader, names: dict, stop, probe_config: dict):
        self.owner = owner
        self.probe_config = probe_config
        self.names = names        # (topic, partition) -> task id, for messages
        self.stop = stop
        self.eof: dict[tuple[str, int], int] = {}
        self.expected = 0
        self.detail: Callable[[], str] | None = None       # per task progress for the log line
        self.quiet = False                                  # progress at debug level

    def expect(self, n: int) -> None:
        self.expected = n

    def _failed(self, starts: dict, ends: dict) -> Callable[[tuple[str, int], KafkaError], Exception]:
        """The error of an error event of partition ``tp`` (PartitionsToEnd's ``error``)."""
        def failed(tp: tuple[str, int], err: KafkaError) -> Exception:
            task = self.names.get(tp)
            if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                if tp in ends:
                    return _of_task(ChangelogMismatch(
                        f"task {task}: restoring a table from its source topic {tp[0]}[{tp[1]}] needs its "
                        f"records from offset {starts.get(tp)} on, but the broker does not hold them "
                        f"({err.str()}): deleted by retention, or the topic was recreated; reset the "
                        f"application or backfill it"), task)
                return _of_task(ChangelogMismatch(
                    f"task {task}: local state says it reflects changelog {tp[0]}[{tp[1]}] up to offset "
                    f"{starts.get(tp)}, past the changelog's end ({err.str()}); the changelog was recreated "
                    f"or the state directory belongs to another cluster: delete it to restore"), task)
            return _of_task(KafkaIOError(f"restoring task {task} from {tp[0]}[{tp[1]}]: {err.str()}"), task)
        return failed

    def read_many(self, starts, ends=None):
        """``(tp, offset, key, value, timestamp)`` of every record from ``starts`` to partition EOF
        (or, for a partition in ``ends``, to the record before that offset: read from its exact
        offset, 0 included), and None after each batch. Another read may use the consumer between
        two batches: this one's partitions are then assigned again where it is."""
        if not starts:
            return
        owner = self.owner
        ends = ends or {}
        # (a transient error event, the broker down or paused: librdkafka retries, and the restore
        # goes on when it answers; ``STALL_S`` without progress is an error)
        reading = PartitionsToEnd(owner.consumer, starts, ends, exact=bool(ends))
        owner.reading = reading
        n = progressed = 0
        checked = False
        t0 = last_log = last_progress = time.monotonic()
        try:
            # a short wait: consume() waits all of it unless the batch fills, and the end of a
            # partition (often an empty one) comes as a single event; this is how long one call
            # waits when nothing arrives (and so how far a restore step between the group
            # consumer's polls can overrun its budget)
            for m in reading.steps(error=self._failed(starts, ends), batch=2000, wait_s=0.01):
                if m is not None:
                    n += 1
                    yield (m.topic(), m.partition()), m.offset(), m.key(), m.value(), m.timestamp()[1]
                    continue
                now = time.monotonic()
                if n != progressed:
                    progressed, last_progress = n, now
                yield None   # a step ends with each batch (restore_steps)
                if owner.reading is not reading:   # another read used the consumer meanwhile
                    reading.consumer = owner.consumer   # (a new one after a reset)
                    reading.assign()
                    owner.reading = reading
                    # (the wait for its turn is no silence of the broker's: the clocks start again)
                    now = last_progress = time.monotonic()
                if self.stop is not None and self.stop.is_set():
                    raise RestoreInterrupted()
                if now - last_progress > SILENT_S and not checked:
                    # A broker that answers a fetch past the end with nothing at all (Tansu; Kafka
                    # says OFFSET_OUT_OF_RANGE): find the real end of each silent partition.
                    checked = True
                    for tp in sorted(reading.pending):
                        if starts[tp] > 0:
                            end = _end_offset(self.probe_config, tp)
                            if end < starts[tp]:
                                raise _of_task(ChangelogMismatch(
                                    f"task {self.names.get(tp)}: local state says it reflects changelog "
                                    f"{tp[0]}[{tp[1]}] up to offset {starts[tp]}, but the changelog ends at "
                                    f"offset {end}; the changelog was recreated or the state directory "
                                    f"belongs to another cluster: delete it to restore"), self.names.get(tp))
                if now - last_progress > STALL_S:
                    raise KafkaIOError(f"restoring tasks: no progress for {STALL_S:.0f} s "
                                      f"(partitions not at their end: {sorted(reading.pending)})")
                if now - last_log >= PROGRESS_EVERY_S:
                    last_log = now
                    rate = n / max(now - t0, 1e-6)
                    remaining = max(self.expected - n, 0) if self.expected else "?"
                    detail = self.detail() if self.detail is not None else ""
                    log.log(logging.DEBUG if self.quiet else logging.INFO,
                            "restoring: %d records restored, %.0f records/s, %s remaining%s",
                            n, rate, remaining, f" (per task: {detail})" if detail else "")
        finally:
            self.eof.update(reading.eof)
            if owner.reading is reading:
                owner.reading = None
                owner.consumer.unassign()


def _end_offset(conf: dict, tp) -> int:
    """The end of a partition, read from its beginning to partition EOF (no latest-offset query)."""
    c = kafka.new_consumer({**conf, "auto.offset.reset": "earliest"}, "finding a changelog's end")
    try:
        reader = PartitionsToEnd(c, {tp: 0})
        read_to = [0]   # after the last record read (named if the end is not reached)
        for m in reader.records(
                STALL_S, batch=5000, wait_s=0.05,
                error=lambda _, err: KafkaIOError(f"reading {tp[0]}[{tp[1]}] to its end: {err.str()}"),
                timeout=lambda _: KafkaIOError(f"reading {tp[0]}[{tp[1]}] to its end took more than "
                                               f"{STALL_S:.0f} s (at {read_to[0]})")):
            read_to[0] = cast(int, m.offset()) + 1
        return reader.eof[tp]
    finally:
        c.close()


class RestoreInterrupted(Exception):
    """A stop was requested during a restore (progress up to the last intermediate commit is kept)."""
