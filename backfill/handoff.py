"""The hand-off: a task's final stores -> its changelogs and commit record (in the executor that
ran it), the group's offsets at the snapshot, and (with a ``--state-dir``) the worker's layout on
the driver's machine.

Invariants:

- **The changelogs are the hand-off.** Each store's final contents go to its changelog
  partition, then a commit record (positions: the snapshot for sources, the end now for
  internal topics; every changelog end) to the task changelog, as a worker's commit unit leaves
  them: a worker on any machine, with an empty state directory, restores the same stores.
- **The layout on the driver comes through Spark.** A task's contents and checkpoint travel
  back to the driver as Spark data (``("db", partition, bytes)`` items of its run); the driver
  builds each database through SST files under its build root (``build_database``) and the job
  installs them all or none (``backfill.sst``). No file an executor wrote is read, except on a
  ``local`` master, whose executors are processes of the driver's machine: there each task
  builds its database under the driver's build root itself (``JobContext.local_root``).
"""

from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path
from typing import Any

from processor.engine.task_id import TaskId
from processor.errors import ConfigError

log = logging.getLogger("processor.backfill")

DB_FORMAT = 1   # version byte of a "db" item: (sub, partition, column families, checkpoint)


def write_task(ctx, sub, partition, stores, t0) -> dict:
    """A task's final stores -> its changelogs and commit record (positions: the snapshot for
    sources, the end now for internal topics). Returns entries per contract store, seconds
    (``load``: from ``t0`` to the changelogs) and, when there is a state directory to fill,
    either ``db``: the task's column families and checkpoint as bytes for the driver
    (``DB_FORMAT``; ``build_database``), or on a local master ``built``: the database built
    under the build root (``JobContext.local_root``) by the task itself."""
    from processor import provenance
    from processor.kafka import clients as kafka
    from processor.state import commit_record
    from processor.state.store import BOOKKEEPING_STORE, TASK_STORE

    inputs = ctx.topo.source_topics(sub)
    positions = {}
    for t in inputs:
        if t in ctx.internal:
            positions[(t, partition)] = ctx.internal_ends.get((t, partition), 0)
        else:
            positions[(t, partition)] = ctx.snapshot[(t, partition)][1]
    changelogs = ctx.topo.changelogs_of(sub)
    # (a table whose changelog is its source topic: its store is in the database only; the
    # records the tasks rejected, which a restore from the topic does not apply, are named in
    # the task store, which goes to the task changelog)
    contents = {name: list(stores.store(name).items())
                for name in (*changelogs, *ctx.topo.source_changelogs_of(sub))}
    # high-water marks of records whose source is an internal topic: those records were rows
    # of a shuffle, never in Kafka, so no replay of them can come; their (virtual) offsets must
    # not hold back the records the worker sends to those topics from their real end on
    kept = []
    for k, v in contents[BOOKKEEPING_STORE]:
        src = provenance.mark_source(k)
        if src is None or src not in ctx.internal:
            kept.append((k, v))
    contents[BOOKKEEPING_STORE] = kept
    # Not idempotent: every key goes to its changelog once (the commit record after a flush),
    # so a retry's duplicate or reordering cannot change what a restore builds, and an
    # idempotent producer's start costs a fixed ~0.5 s per task on the local broker.
    producer = kafka.new_producer({**kafka.producer_defaults(ctx.bootstrap_servers), "enable.idempotence": False,
                                   **ctx.producer_config}, f"changelogs of task {sub}_{partition}")
    writes = {}
    for name, topic in changelogs.items():
        if name == TASK_STORE:
            continue
        before = ctx.changelog_ends.get((topic, partition), 0)
        entries = contents[name]
        if before:   # records of an earlier (killed or replaced) run: tombstone what we do not write
            ours = {k for k, _ in entries}
            entries = entries + [(k, None) for k in existing_keys(ctx.bootstrap_servers, topic, partition,
                                                                    before) if k not in ours]
        writes[(topic, partition)] = (entries, before)
    t1 = time.monotonic()
    ends = produce_all(producer, writes)          # every store changelog, one flush
    task_topic = changelogs[TASK_STORE]
    record = commit_record.encode(commit_record.CommitRecord(1, positions, ends))
    task_entries = contents[TASK_STORE]
    before = ctx.changelog_ends.get((task_topic, partition), 0)
    if before:   # an earlier run's units (a worker's, a killed backfill's): their keys end here too
        ours = {k for k, _ in task_entries}
        task_entries = task_entries + [(k, None) for k in existing_keys(ctx.bootstrap_servers, task_topic,
                                                                          partition, before)
                                       if k not in ours and k != commit_record.COMMIT_KEY]
    task_end = produce_all(producer, {(task_topic, partition): (
        task_entries + [(commit_record.COMMIT_KEY, record)], 0)})[(task_topic, partition)]
    contents[TASK_STORE] = sorted(dict(contents[TASK_STORE] + [(commit_record.COMMIT_KEY, record)]).items())
    checkpoint = {**positions, **ends, (task_topic, partition): task_end}
    t2 = time.monotonic()
    out: dict[str, Any] = {"entries": {name: len(v) for name, v in contents.items() if not name.startswith("__")}}
    if ctx.build_databases:   # built where it is installed from, or bytes for the driver (backfill.passage)
        out.update(ctx.passage.database(sub, partition, contents, checkpoint))
    out["seconds"] = {"load": t1 - t0, "changelogs": t2 - t1, "database": time.monotonic() - t2}
    return out


def existing_keys(bootstrap_servers, topic, partition, end) -> list[bytes]:
    """The keys of ``topic[partition]`` below ``end`` (a changelog an earlier run wrote)."""
    from processor.kafka import clients as kafka
    from processor.kafka.read_to_end import PartitionsToEnd

    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update({"group.id": f"backfill-keys-{time.time_ns()}", "fetch.wait.max.ms": 50})
    c = kafka.new_consumer(conf, f"reading the keys of changelog {topic}[{partition}]")
    keys: dict[bytes, None] = {}
    try:
        # (error events are left to librdkafka's retries)
        for m in PartitionsToEnd(c, {(topic, partition): 0}, {(topic, partition): end}).records(
                60, error=None, timeout=lambda _: ConfigError(
                    f"backfill: reading the earlier records of {topic}[{partition}] did not finish in 60 s")):
            key = m.key()
            if key is not None:
                keys[key] = None
        return list(keys)
    finally:
        c.close()


def produce_all(producer, writes: dict) -> dict:
    """``{(topic, partition): (entries, end before)}`` -> produced, one flush; returns each
    partition's end offset after its entries (the end before, for no entries)."""
    ends = {tp: before for tp, (_, before) in writes.items()}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
        else:
            tp = (msg.topic(), msg.partition())
            ends[tp] = max(ends[tp], msg.offset() + 1)

    for (topic, partition), (entries, _) in writes.items():
        for k, v in entries:
            while True:
                try:
                    producer.produce(topic, v, k, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(120):
        raise ConfigError(f"backfill: writing changelogs {sorted(writes)} did not finish within 120 s")
    if errors:
        raise ConfigError(f"backfill: writing changelogs failed: {errors[0]}")
    return ends




def encode_database(sub, partition, contents, checkpoint) -> bytes:
    """A task's column families and checkpoint -> a ``db`` item for the driver (``DB_FORMAT``)."""
    return bytes([DB_FORMAT]) + pickle.dumps((sub, partition, contents, checkpoint), protocol=pickle.HIGHEST_PROTOCOL)


def build_database(build_root, item: bytes) -> tuple[int, int]:
    """A ``db`` item (``write_task``) -> the task's database under ``build_root`` (on the driver),
    built through SST files (``backfill.sst.build_task_database``). Returns (sub, partition)."""
    from backfill.sst import build_task_database

    if not item or item[0] != DB_FORMAT:
        raise ConfigError(f"backfill: a task's stores came back in format {item[:1]!r}, not {DB_FORMAT} "
                          f"(executors running another version of the backfill?)")
    sub, partition, contents, checkpoint = pickle.loads(item[1:])
    build_task_database(Path(build_root) / TaskId(sub, partition).dirname, contents, checkpoint)
    return sub, partition


def commit_group_offsets(bootstrap_servers, application_id, snapshot, internal_ends, consumer_config) -> None:
    from confluent_kafka import TopicPartition

    from processor.kafka import clients as kafka

    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update(consumer_config or {})
    conf["group.id"] = application_id
    c = kafka.new_consumer(conf, "committing the group's offsets at the snapshot")
    try:
        offsets = [TopicPartition(t, p, e) for (t, p), (_, e) in sorted(snapshot.items())]
        offsets += [TopicPartition(t, p, e) for (t, p), e in sorted(internal_ends.items()) if e > 0]
        if offsets:
            # the same offsets again after a transient error (a coordinator moving or loading)
            kafka.retry_transient(lambda: kafka.raise_partition_error(c.commit(offsets=offsets, asynchronous=False)),
                                  f"committing the offsets of group {application_id!r} at the snapshot")
    finally:
        c.close()


def read_global_tables(bootstrap_servers, topo, offsets: dict, consumer_config=None) -> tuple[dict, int, dict]:
    """The global tables at the snapshot: ``({store: [(key, stored bytes)]}, records read,
    {store: the latest timestamp of a record applied})``, each topic read whole up to its
    snapshot end by the worker's rule (``processor/engine/global_tables.py``), so every task
    joins what a worker bootstrapped to the same offsets would hold (a stream record older than
    a table's latest change joins the table as it is at the snapshot: named in the report)."""
    from backfill.range_reader import Range, iter_range
    from processor.engine.global_tables import apply_global_record
    from processor.state.memory import MemoryStore

    tables: dict[str, list] = {}
    n = 0
    latest: dict[str, int] = {}
    for g in topo.global_stores.values():
        store = MemoryStore(g.name)
        for (topic, partition), (start, end) in sorted(offsets.items()):
            if topic != g.topic or end <= start:
                continue
            for msgs in iter_range(bootstrap_servers, Range(topic, partition, start, end), consumer_config):
                for m in msgs:
                    ts = m.timestamp()[1]
                    if apply_global_record(store, g, m.key(), m.value(), ts):
                        latest[g.name] = max(latest.get(g.name, ts), ts)
                    n += 1
        tables[g.name] = sorted(store.items())
    return tables, n, latest
