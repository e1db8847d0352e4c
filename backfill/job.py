"""The backfill job: topic history -> the topology's own tasks in Spark executors -> the worker's
stores, changelogs and group offsets -> ``processor run`` continues at the snapshot.

Invariants:

- **One engine.** Executors run ``processor.engine.task.Task`` over the topology's own operators
  (what the worker and ``TopologyTestDriver`` run) with in-memory stores. A task gets its
  records in offset order per input partition; across a task's inputs, the record with the
  lowest timestamp goes first (ties: topic, partition), as Kafka Streams picks.
- **Internal topics are shuffles.** What a task sends to an internal topic (repartition,
  foreign-key subscription/response) becomes a row for the task that reads it, routed exactly as
  the worker routes it (the sink's explicit partition, else murmur2 of the key: the producer's
  ``murmur2_random``), with the same headers (provenance). Sub-topologies run in *runs*: one Spark
  stage per sub-topology that has input, in topological order, repeated until no row is pending
  (a foreign-key join's cycle, left -> right -> left, takes three runs). A task's stores are
  kept between its runs (``<build root>/state``). Then each sub-topology is flushed once (as a
  graceful stop does), and what that sends is processed too.
- **Exactly the snapshot.** The end offset of every source partition is taken first (fetch high
  watermark, ``backfill.snapshot``), at the isolation level of the worker that continues
  (``read_committed`` under ``processing_guarantee="exactly_once"``: below an open transaction);
  exactly the history below it is read, at the same level
  (``backfill.kafka_source``, plus ``--archive`` Parquet below the earliest offset Kafka holds);
  the checkpoint, the commit record and the group offsets say "next offset = snapshot end", and
  for internal topics "= their end now" (the shuffles never went through them). So a worker
  started after the backfill processes no record below the snapshot again and skips none above it.
- **The worker's layout, all or nothing.** Every task's database is built through SST files
  (``backfill.sst``) under a build root next to the state directory and moved into
  ``<state-dir>/<application-id>/task-<sub>_<partition>`` only at the end: a failure or a kill
  leaves no state, and a re-run starts afresh (a killed run's build root is removed by the next).
- **Changelog hand-off.** Each store's final contents go to its changelog partition, then a
  commit record (positions as above, every changelog end) to the task changelog, as a worker's
  commit unit leaves them: a worker on another machine restores the same state from the
  changelogs; the local checkpoint names those ends, so a worker on this directory restores nothing.
- **Outputs.** Without ``emit_outputs`` no sink is written (the outputs are assumed to exist).
  With it, each sink receives the history's result once: a table's sink (``to_stream().to()``)
  the last record per key, a stream sink every record, in order. Dead-letter records follow the
  topology's ``on_error`` policy as in the worker, produced once, whether or not outputs are.

Where the stores can differ from a live worker's (README "Backfill"): high-water marks of
internal records whose source is itself an internal topic are not kept (those records never
existed in Kafka, so none can be replayed); ``Emit.every(clock="wall")`` records wall-clock
emission times.
"""

from __future__ import annotations

import gc
import heapq
import logging
import os
import pickle
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from processor.errors import ConfigError

log = logging.getLogger("processor.backfill")

PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")

# rows a task run writes: internal records for the next runs, outputs for the end
_ROW_FIELDS = ["kind", "topic", "partition", "key", "value", "ts", "headers", "origin", "seq", "phase"]
_SAVED_FIELDS = _ROW_FIELDS + ["run"]


@dataclass
class BackfillReport:
    application_id: str
    snapshot: dict                               # (topic, partition) -> (start, end)
    rows_read: int = 0                           # input records read from history
    rows_replayed: int = 0                       # of those, fed to the tasks (after compaction)
    compaction: dict = field(default_factory=dict)   # source topic -> mode (README "Backfill")
    records_processed: int = 0                   # every record a task processed (incl. internal)
    rows_per_store: dict = field(default_factory=dict)   # store -> entries (all tasks)
    tasks: int = 0
    runs: list = field(default_factory=list)     # (sub-topology, flush, records, seconds)
    outputs_emitted: int = 0
    dead_lettered: int = 0
    subscriptions_superseded: int = 0            # foreign-key subscription records not sent (_RowCollector)
    seconds: dict = field(default_factory=dict)  # stage -> seconds
    installed: list = field(default_factory=list)
    finalized: set = field(default_factory=set)  # sub-topologies whose tasks were written by their last run
    failed_in_processing: dict = field(default_factory=dict)   # input topic -> records failed (user function, output)

    def lines(self) -> list[str]:
        out = [f"backfill of {self.application_id}: {self.rows_read} input rows read, {self.records_processed} "
               f"records processed in {len(self.runs)} run(s), {self.tasks} task(s) written, "
               f"{self.outputs_emitted} output record(s) emitted, {self.dead_lettered} dead-lettered"]
        for (t, p), (s, e) in sorted(self.snapshot.items()):
            out.append(f"  snapshot {t}[{p}]: offsets [{s}, {e})")
        for t, mode in sorted(self.compaction.items()):
            out.append(f"  source {t}: {mode}")
        out.append(f"  rows read {self.rows_read}, replayed after compaction {self.rows_replayed}")
        if self.subscriptions_superseded:
            out.append(f"  foreign-key subscription records superseded within a run (not sent): "
                       f"{self.subscriptions_superseded}")
        for sub, flush, n, secs in self.runs:
            out.append(f"  run: sub-topology {sub}{' (flush)' if flush else ''}: {n} records, {secs:.1f} s")
        for store, n in sorted(self.rows_per_store.items()):
            out.append(f"  store {store}: {n} entries")
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        rate = (f"; {self.rows_read / self.seconds['process']:.0f} input rows/s in the process stage"
                if self.seconds.get("process") else "")
        out.append(f"  seconds: {stages} (total {sum(self.seconds.values()):.1f} s){rate}")
        return out


def _spark_session(master: str | None):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:   # under spark-submit: its master
        builder = builder.master(master or "local[*]")
    return (builder.appName("processor-backfill")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


def _refuse_existing(bootstrap_servers, application_id, state_dir: Path, topics, counts, consumer_config) -> None:
    from confluent_kafka import TopicPartition

    from processor.runtime import kafka

    target = state_dir / application_id
    existing = sorted(p.name for p in target.glob("task-*")) if target.exists() else []
    if existing:
        raise ConfigError(f"state directory {target} already holds state of application "
                          f"{application_id!r} ({', '.join(existing[:4])}{'...' if len(existing) > 4 else ''}); "
                          f"pass --force to replace it")
    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update(consumer_config or {})
    conf["group.id"] = application_id
    c = kafka.new_consumer(conf, "checking the group's committed offsets")
    try:
        committed = c.committed([TopicPartition(t, p) for t in topics for p in range(counts[t])], timeout=30)
    finally:
        c.close()
    done = [f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in committed if tp.offset >= 0]
    if done:
        raise ConfigError(f"consumer group {application_id!r} has committed offsets ({', '.join(done[:4])}"
                          f"{'...' if len(done) > 4 else ''}): the application already ran; pass --force "
                          f"to backfill over it")


def _run_order(topo) -> list[int]:
    """Sub-topologies in topological order of the internal topics between them (a cycle, such as a
    foreign-key join's, is broken where it is entered first: runs repeat until nothing is pending)."""
    readers = topo.subtopology_of_topic()
    edges: dict[int, set[int]] = {i: set() for i in range(len(topo.subtopologies))}
    for topic, writers in topo.internal_topics().items():
        for w in writers:
            if readers[topic] != w:
                edges[w].add(readers[topic])
    order, state = [], {}

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


def run(topology, bootstrap_servers: str, application_id: str, state_dir, spark=None,
        emit_outputs: bool = False, archives: dict | None = None, force: bool = False,
        master: str | None = None, on_error: str = "dlq", consumer_config: dict | None = None,
        producer_config: dict | None = None, max_records_per_split: int | None = None,
        client_config=None, replication_factor: int | None = None,
        topic_configs: dict | None = None, processing_guarantee: str = "at_least_once") -> BackfillReport:
    """Rebuild every task's stores of ``topology`` for ``application_id`` from topic history into
    ``state_dir`` and hand over to the worker (see the module docstring). ``client_config``
    (``processor.runtime.client_config.ClientConfig``) reaches every client the driver and the
    executors open; ``consumer_config`` / ``producer_config`` are layered over its kinds.
    Internal topics are created and checked as the worker does (``replication_factor``,
    ``topic_configs`` per kind: processor/runtime/internal_topics.py). ``processing_guarantee``
    is the one of the worker that continues: the history is read at that worker's isolation level
    (``read_committed`` under ``exactly_once``, ``read_uncommitted`` otherwise; a consumer-config
    ``isolation.level`` overrides it), so the snapshot ends where that worker's view ends (below
    an open transaction under ``read_committed``) and no record the worker would not see (an
    aborted one, on a broker that hides them) gets into the stores."""
    from processor.engine.routing import Routing
    from processor.engine.task import dlq_topic_for
    from processor.runtime import internal_topics, kafka
    from processor.runtime.client_config import ClientConfig
    from processor.runtime.partitioning import determine_partitioners

    from backfill.snapshot import snapshot_offsets
    from backfill.sst import install_task_databases, new_build_root

    if processing_guarantee not in PROCESSING_GUARANTEES:
        raise ConfigError(f"processing_guarantee must be one of {', '.join(PROCESSING_GUARANTEES)}, "
                          f"not {processing_guarantee!r}")
    config = ((client_config or ClientConfig()).with_kind("consumer", consumer_config)
              .with_kind("producer", producer_config))
    # partitioner detection samples as the worker does: at the level the user gave, else
    # read_uncommitted (processor/runtime/partitioning.py), so both decide on the same records
    sampling_config = {"isolation.level": "read_uncommitted", **config.for_kind("consumer")}
    if "isolation.level" not in config.for_kind("consumer"):
        # the worker's rule (processor/runtime/worker.py), for every other consumer below
        config = config.with_kind("consumer", {"isolation.level": "read_committed" if processing_guarantee
                                               == "exactly_once" else "read_uncommitted"})
    # every client below, in the driver and (through the job context) the executors, gets them
    bootstrap_servers = kafka.cluster_of(bootstrap_servers, config)
    consumer_config = config.for_kind("consumer") or None
    producer_config = config.for_kind("producer") or None
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    topo = topology.for_application(application_id, config.registry)   # registry serdes: their settings
    topo.check_serde_settings()
    state_dir = Path(state_dir)
    counts = kafka.topic_partitions(bootstrap_servers)
    sources = list(dict.fromkeys(topo.external_source_topics()))
    wanted = sources + (topo.sink_topics(internal=False) if emit_outputs else [])
    missing = sorted({t for t in wanted if t not in counts})
    if missing:
        raise ConfigError(f"topic(s) {', '.join(missing)} do not exist on {bootstrap_servers}; "
                          f"create them before backfilling application {application_id!r}")
    for topic, path in (archives or {}).items():
        if topic not in sources:
            raise ConfigError(f"archive given for topic {topic!r}, which this topology does not read "
                              f"(sources: {', '.join(sorted(sources))})")
        if not Path(path).exists():
            raise ConfigError(f"archive of topic {topic!r}: path {path} does not exist")
        if topic in topo.reused_source_topics():
            raise ConfigError(f"archive given for topic {topic!r}, which is a table's changelog "
                              f"(reuse_source_topics): a restore from the topic could not rebuild the "
                              f"archived history; build the topology without reuse_source_topics")
    for i in range(len(topo.subtopologies)):
        ext = {t: counts[t] for t in topo.source_topics(i) if t in sources}
        if len(set(ext.values())) > 1:
            listing = ", ".join(f"{t}={n}" for t, n in sorted(ext.items()))
            raise ConfigError(f"co-partitioned source topics of sub-topology {i} have different "
                              f"partition counts ({listing}); they must be equal")
    if not force:
        _refuse_existing(bootstrap_servers, application_id, state_dir, sources, counts, consumer_config)
    for stale in state_dir.glob(f"{application_id}.backfill-tmp-*"):   # a killed run's leftovers
        shutil.rmtree(stale, ignore_errors=True)

    own_session = spark is None
    if own_session:
        t_session = time.monotonic()
        spark = _spark_session(master)
        seconds["spark session"] = time.monotonic() - t_session
        t0 = time.monotonic()
    # the executors' Python workers start and import the engine while the driver takes the snapshot
    warm_up = _WarmUp(spark)
    build_root = None
    try:
        # 1. topics as the worker creates them; the snapshot; each source's partitioner
        wanted = internal_topics.wanted_topics(topo, counts)
        internal_topics.ensure(bootstrap_servers, application_id, wanted, counts, replication_factor, topic_configs)
        internal_topics.warn_deleting_sources(bootstrap_servers, sorted(topo.reused_source_topics()))
        internal_counts = {t: n for t, (n, kind) in wanted.items() if kind != "changelog"}
        counts.update(internal_counts)
        dlq = dlq_topic_for(application_id)
        if on_error == "dlq" and dlq not in counts:
            rf = (replication_factor if replication_factor is not None
                  else internal_topics.default_replication_factor(bootstrap_servers))
            kafka.create_topics(bootstrap_servers, {dlq: 1}, replication_factor=rf)
        changelog_topics = topo.changelog_topic_partitions(counts)
        # one snapshot of every partition involved: the sources' history, and where the internal
        # and changelog topics end (new topics: 0); the partitioners are sampled meanwhile (both
        # wait on the broker, not the CPU)
        with ThreadPoolExecutor(1) as pool:
            sampling = pool.submit(determine_partitioners, topo, bootstrap_servers, dict(counts),
                                   sampling_config, application_id)
            everything = snapshot_offsets(bootstrap_servers,
                                          sources + list(internal_counts) + list(changelog_topics),
                                          consumer_config=consumer_config)
            choices = sampling.result()
        snapshot = {tp: r for tp, r in everything.items() if tp[0] in set(sources)}
        internal_ends = {tp: e for tp, (_, e) in everything.items() if tp[0] in internal_counts}
        changelog_ends = {tp: e for tp, (_, e) in everything.items() if tp[0] in changelog_topics}
        if any(changelog_ends.values()):   # a killed backfill, or --force over an earlier run
            log.info("changelog topics already hold records: keys the backfill does not write get tombstones")
        topo = topo.with_partitioning(choices)
        seconds["snapshot"] = time.monotonic() - t0
        for (t, p), (s, e) in sorted(snapshot.items()):
            log.info("snapshot %s[%d]: offsets [%d, %d)", t, p, s, e)
        warm_up.join()
        build_root = new_build_root(state_dir, application_id)
        report = BackfillReport(application_id, snapshot, seconds=seconds)
        ctx = _JobContext(topo, Routing(choices, counts), counts, str(build_root), bootstrap_servers,
                          on_error, dlq, producer_config or {}, emit_outputs)
        ctx.snapshot, ctx.internal_ends, ctx.changelog_ends = snapshot, internal_ends, changelog_ends
        plan = {} if emit_outputs else compaction_plan(topo)
        why = ("every record replayed (--emit-outputs: the sinks receive what every change produces)"
               if emit_outputs else "every record replayed (a reader's state depends on the history)")
        report.compaction = {t: plan.get(t, why) for t in sources}
        t1 = time.monotonic()
        _process(spark, ctx, snapshot, archives, consumer_config, max_records_per_split, report)
        if ctx.compacted and report.failed_in_processing:
            # Records failed in user functions or outputs while tables were reduced: the worker
            # dead-letters (or skips) each failing record of the whole history and keeps the
            # previous value of its key, which a reduction cannot reproduce where the failure
            # shows downstream (e.g. a foreign-key join's joiner on a reduced right table). So
            # everything is done again, every record replayed.
            failed = ", ".join(f"{t}: {c}" for t, c in sorted(report.failed_in_processing.items()))
            log.warning("records failed in processing (%s) while tables were reduced to their last "
                        "changes: processing the history again, record by record", failed)
            shutil.rmtree(build_root, ignore_errors=True)
            build_root = new_build_root(state_dir, application_id)
            ctx.build_root = str(build_root)
            ctx.compacted = set()
            report.compaction = {t: f"every record replayed (records failed in processing: {failed})"
                                 for t in sources}
            report.rows_read = report.rows_replayed = 0
            report.runs, report.finalized, report.failed_in_processing = [], set(), {}
            report.records_processed = 0
            report.subscriptions_superseded = 0
            _process(spark, ctx, snapshot, archives, consumer_config, max_records_per_split, report)
        seconds["process"] = time.monotonic() - t1
        t2 = time.monotonic()
        stats = _finalize(spark, ctx, report.finalized)
        for store, n in stats.items():
            report.rows_per_store[store] = report.rows_per_store.get(store, 0) + n
        report.tasks = sum(1 for p in build_root.iterdir() if p.name.startswith("task-"))
        seconds["write stores"] = time.monotonic() - t2
        t3 = time.monotonic()
        report.outputs_emitted, report.dead_lettered = _emit(spark, ctx, emit_outputs)
        seconds["outputs"] = time.monotonic() - t3
        t4 = time.monotonic()
        report.installed = [str(p) for p in install_task_databases(build_root, state_dir, application_id,
                                                                   force=force)]
        _commit_group_offsets(bootstrap_servers, application_id, snapshot, internal_ends, consumer_config)
        seconds["install"] = time.monotonic() - t4
    finally:
        warm_up.join()
        if build_root is not None and build_root.exists():
            shutil.rmtree(build_root, ignore_errors=True)
        if own_session:
            spark.stop()
    for line in report.lines():
        log.info("%s", line)
    return report


def _warm_up_worker(_):
    """In an executor: import what the tasks run (a reused Python worker keeps it)."""
    import importlib

    for name in _WARM_UP_MODULES:
        importlib.import_module(name)
    return os.getpid()


# (Arrow, for archives and outputs only, is imported where those are)
_WARM_UP_MODULES = ["backfill.range_reader", "backfill.sst", "processor.engine.task", "processor.state.memory",
                    "confluent_kafka"] + [f"processor.operators.{m}" for m in (
                        "source", "sink", "filter", "map_values", "aggregate", "group_by", "table_join",
                        "stream_join", "foreign_key_join")]


class _WarmUp:
    """A Spark job, in a thread, with one task per core that imports the engine in the
    executors' Python workers (Spark reuses them), so that the first run does not pay for their
    start; it overlaps the snapshot, which waits on the broker. A failure is only logged: the
    runs that follow meet it again and report it."""

    def __init__(self, spark):
        import threading

        self.error = None
        n = max(1, spark.sparkContext.defaultParallelism)

        def job():
            try:
                spark.sparkContext.parallelize(range(n), n).map(_warm_up_worker).collect()
            except Exception as exc:   # noqa: BLE001 (reported by the runs)
                self.error = exc

        self._thread = threading.Thread(target=job, name="backfill-warm-up", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            log.warning("backfill: warming up the executors failed: %s", str(self.error).splitlines()[0])
            self.error = None


class _JobContext:
    """What executors need (pickled into every Spark task)."""

    def __init__(self, topo, routing, counts, build_root, bootstrap_servers, on_error, dlq, producer_config,
                 emit_outputs=False):
        self.emit_outputs = emit_outputs
        # set once the snapshot is taken (what the checkpoints and commit records say)
        self.snapshot: dict = {}          # (source topic, partition) -> (start, end)
        self.internal_ends: dict = {}     # (internal topic, partition) -> end
        self.changelog_ends: dict = {}    # (changelog topic, partition) -> end before the backfill
        # with outputs emitted, nothing is compacted: a key whose last changes fail a filter would
        # lose the tombstone its earlier passing value needs at the sink
        self.compacted = set() if emit_outputs else set(compaction_plan(topo))
        self.topo = topo
        self.routing = routing
        self.counts = counts
        self.build_root = build_root
        self.bootstrap_servers = bootstrap_servers
        self.on_error = on_error
        self.dlq = dlq
        self.producer_config = producer_config
        # executors log as the driver does (in local mode their stderr is the driver's console)
        self.log_level = logging.getLogger().getEffectiveLevel()
        from processor.logs import JsonFormatter   # executors log as the driver does (--log-format)
        self.log_json = any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
        self.internal = set(topo.internal_topics())
        # foreign-key subscription topics (their sinks route like the right table)
        self.subscription_topics = {n.sink_topic for n in topo.nodes
                                    if n.sink_topic and getattr(n.attrs, "route_like", None)}

    def tasks_of(self, sub: int) -> int:
        return max(self.counts[t] for t in self.topo.source_topics(sub))

    def state_path(self, task_id: str) -> Path:
        return Path(self.build_root) / "state" / f"task-{task_id}.pkl"

    def rows_dir(self, run: int) -> Path:
        return Path(self.build_root) / "rows" / f"run-{run:05d}"


class _StageProgress:
    """A progress bar (tqdm, on stderr) of the jobs started inside the block. With ``rows_dir``
    (a run): rows read / ``total_rows``, rows/s, and the Spark tasks done as a postfix, from the
    counters the run's tasks write there (``_RowCounter``); otherwise Spark tasks done / total
    from Spark's status tracker."""

    def __init__(self, spark, what: str, rows_dir: Path | None = None, total_rows: int | None = None):
        self.spark = spark
        self.what = what
        self.rows_dir = rows_dir
        self.total_rows = total_rows
        self._stop = None

    def _tasks(self, tracker, before) -> tuple[int, int]:
        done = total = 0
        for job in set(tracker.getJobIdsForGroup(None)) - before:
            info = tracker.getJobInfo(job)
            for sid in (info.stageIds if info else ()):
                st = tracker.getStageInfo(sid)
                if st:
                    done += st.numCompletedTasks
                    total += st.numTasks
        return done, total

    def __enter__(self):
        import threading

        from tqdm import tqdm

        tracker = self.spark.sparkContext.statusTracker()
        before = set(tracker.getJobIdsForGroup(None))
        self._stop = threading.Event()
        by_rows = self.rows_dir is not None
        bar = tqdm(desc=self.what, unit="row" if by_rows else "task", unit_scale=by_rows, leave=True,
                   file=sys.stderr, disable=None, total=self.total_rows if by_rows else None)

        def poll():
            while True:
                done, total = self._tasks(tracker, before)
                if by_rows:
                    bar.n = _RowCounter.total(self.rows_dir)
                    if total:
                        bar.set_postfix_str(f"tasks {done}/{total}", refresh=False)
                else:
                    if total:
                        bar.total = total
                    bar.n = done
                bar.refresh()
                if self._stop.wait(0.5):
                    bar.close()
                    return

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


class _RowCounter:
    """Rows a task has read so far, in ``<rows dir>/progress/task-<id>`` (rewritten at most every
    0.25 s, and at the end), for the driver's progress bar."""

    def __init__(self, rows_dir: Path, task_id: str):
        self.path = rows_dir / "progress" / f"task-{task_id}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.n = 0
        self._written = 0.0

    def add(self, n: int) -> None:
        self.n += n
        if time.monotonic() - self._written > 0.25:
            self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(self.n))
        os.replace(tmp, self.path)
        self._written = time.monotonic()

    @staticmethod
    def total(rows_dir: Path) -> int:
        n = 0
        for f in (rows_dir / "progress").glob("task-*"):
            try:
                n += int(f.read_text() or 0)
            except (OSError, ValueError):   # being replaced
                pass
        return n


# -- processing: runs of sub-topologies until nothing is pending ------------------------------------
def _process(spark, ctx, snapshot, archives, consumer_config, max_records_per_split, report) -> None:
    """Runs of sub-topologies until nothing is pending. A run is one Spark job with one Spark task
    per task of the sub-topology: it reads the task's own input partitions' history (the offset
    ranges of the snapshot, with the data source's reader, ``iter_range``; Kafka partition i is
    task i, so no shuffle is needed) and the internal rows earlier runs addressed to it."""
    topo = ctx.topo
    order = _run_order(topo)
    reads = {i: set(topo.source_topics(i)) for i in order}
    last_run = {i: -1 for i in order}
    produced: list[tuple[int, dict[str, int]]] = []    # run -> internal rows per topic
    external_done: set[int] = set()
    flushed: set[int] = set()
    run_no = 0

    def pending_runs(sub):
        return [r for r, per_topic in produced if r > last_run[sub] and any(per_topic.get(t) for t in reads[sub])]

    while True:
        late = sorted(i for i in report.finalized if pending_runs(i))
        if late:   # the sanity check of _receivers: a written task can take no more records
            raise RuntimeError(f"backfill: internal error: rows for sub-topology {late[0]} after its last run")
        sub, flush = None, False
        for i in order:
            has_external = i not in external_done and any(
                e > s or t in (archives or {}) for (t, _), (s, e) in snapshot.items() if t in reads[i])
            if has_external or pending_runs(i):
                sub = i
                break
        if sub is None:
            sub = next((i for i in order if i not in flushed and _defers_emissions(topo, i)), None)
            flush = True
            if sub is None:
                break
        t0 = time.monotonic()
        external = {}
        if sub not in external_done:
            # (a partition whose history is all in an archive, beyond Kafka's retention, counts too)
            external = {tp: r for tp, r in snapshot.items()
                        if tp[0] in reads[sub] and (r[1] > r[0] or tp[0] in (archives or {}))}
            external_done.add(sub)
        # the run is the sub-topology's last if nothing that may still run can send it a row (no
        # flush to come either): its tasks then write their databases and changelogs at its end
        final = False
        if not flush and not _defers_emissions(topo, sub):
            run_topics = {t for t, _ in external} | {
                t for r, per_topic in produced if r in pending_runs(sub) for t, c in per_topic.items()
                if c and t in reads[sub]}
            later = [(sub, run_topics)]
            for i in order:
                if i == sub:
                    continue
                topics = {t for r, per_topic in produced if r > last_run[i]
                          for t, c in per_topic.items() if c and t in reads[i]}
                if i not in external_done or (_defers_emissions(topo, i) and i not in flushed):
                    topics = set(reads[i])
                if topics:
                    later.append((i, topics))
            final = sub not in _receivers(topo, later)
        spec = _RunSpec(sub, run_no, flush, external, pending_runs(sub), sorted(reads[sub]),
                        {t: p for t, p in (archives or {}).items() if t in reads[sub]}, consumer_config, final)
        n_tasks = ctx.tasks_of(sub)
        total_rows = None if spec.archives else sum(e - s for (s, e) in external.values()) + sum(
            c for r, per_topic in produced if r in spec.pending for t, c in per_topic.items() if t in reads[sub])
        with _StageProgress(spark, f"run {run_no}: sub-topology {sub}{' (flush)' if flush else ''}",
                            ctx.rows_dir(run_no), total_rows):
            stats = spark.sparkContext.parallelize(range(n_tasks), n_tasks).map(_TaskRun(ctx, spec)).collect()
        _raise_task_errors(stats)
        per_topic: dict[str, int] = {}
        n = 0
        for r in stats:
            n += r["records"]
            report.rows_read += r["read"]
            report.rows_replayed += r["replayed"]
            for t, c in r["failed"].items():
                report.failed_in_processing[t] = report.failed_in_processing.get(t, 0) + c
            for t, c in r["internal"].items():
                per_topic[t] = per_topic.get(t, 0) + c
        produced.append((run_no, per_topic))
        last_run[sub] = run_no
        if flush:
            flushed.add(sub)
        if final:
            report.finalized.add(sub)
            for r in stats:
                for store, c in r["entries"].items():
                    report.rows_per_store[store] = report.rows_per_store.get(store, 0) + c
        report.records_processed += n
        secs = time.monotonic() - t0
        report.runs.append((sub, flush, n, secs))
        task_secs = {k: sum(r["seconds"].get(k, 0) for r in stats) for k in ("read", "process", "write")}
        superseded = sum(r["superseded"] for r in stats)
        report.subscriptions_superseded += superseded
        log.info("backfill run %d: sub-topology %d%s: %d records processed in %d task(s), %.1f s (in the "
                 "tasks: reading %.1f s, processing %.1f s, writing %.1f s%s), %s%s",
                 run_no, sub, " (flush)" if flush else "", n, n_tasks, secs, task_secs["read"],
                 task_secs["process"], task_secs["write"],
                 "; its last run: task databases and changelogs written" if final else "",
                 ", ".join(f"{c} rows to {t}" for t, c in sorted(per_topic.items())) or "no internal rows",
                 f" ({superseded} superseded subscription records not sent)" if superseded else "")
        run_no += 1


@dataclass
class _RunSpec:
    sub: int
    run_no: int
    flush: bool
    external: dict          # (topic, partition) -> (start, end): history to read (first run only)
    pending: list           # earlier runs whose internal rows this sub-topology reads
    reads: list             # topics the sub-topology reads
    archives: dict          # topic -> Parquet path
    consumer_config: dict | None
    final: bool = False     # the sub-topology's last run: its tasks write their databases (_write_task)


def _sinks_reached(topo, sub: int, topics) -> set[str]:
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


def _receivers(topo, starts) -> set[int]:
    """Sub-topologies that can receive an internal row, directly or through others, when the
    ``(sub-topology, topics)`` of ``starts`` process records of those topics."""
    readers = topo.subtopology_of_topic()
    seen, out = set(), set()
    work = [(sub, frozenset(topics)) for sub, topics in starts]
    while work:
        sub, topics = work.pop()
        for t in _sinks_reached(topo, sub, topics):
            r = readers[t]
            out.add(r)
            if (r, t) not in seen:
                seen.add((r, t))
                work.append((r, {t}))
    return out


# -- which table sources are reduced to their last real changes ------------------------------------
def compaction_plan(topo) -> dict[str, str]:
    """``{external table topic: reason}`` for every table source whose history may be reduced to
    the last two real changes per key (README "Backfill"): every store and output downstream of it
    ends the same from them. That holds when what reads the table's changes is only table
    filters and map_values, a table's sink, or a foreign-key join (its left or right side; a
    foreign-key join's results are compared without timestamps anyway), and what looks it up is
    only a foreign-key join. Anything else (aggregations, primary-key and stream-table joins, a
    table's changes as a stream) replays every record: its state depends on the history."""
    from processor.operators.filter import TableFilter
    from processor.operators.foreign_key_join import (ForeignKeyJoinResponder, ForeignKeyJoinResponseResolver,
                                                      ForeignKeyJoinSubscriptionReceiver,
                                                      ForeignKeyJoinSubscriptionSender)
    from processor.operators.map_values import TableMapValues
    from processor.operators.sink import Sink, TableToStream
    from processor.operators.source import TableSource

    def op(n):
        return type(n.factory(n))

    lookers: dict[int, list] = {}
    for n in topo.nodes:
        for x in n.lookups:
            lookers.setdefault(id(x), []).append(n)
    out = {}
    for src in topo.nodes:
        if src.attrs.internal if hasattr(src.attrs, "internal") else False:
            continue
        if not src.source_topic or op(src) is not TableSource:
            continue
        ok, via = True, set()
        stack = [src]
        while stack and ok:
            n = stack.pop()
            for reader in lookers.get(id(n), ()):
                if op(reader) in (ForeignKeyJoinSubscriptionReceiver, ForeignKeyJoinResponseResolver):
                    via.add("foreign-key join")
                else:
                    ok = False
            for c in n.children:
                t = op(c)
                if t in (TableFilter, TableMapValues):
                    stack.append(c)
                elif t is TableToStream:
                    if not all(op(x) is Sink and not x.attrs.internal for x in c.children):
                        ok = False
                    via.add("table sink")
                elif t is Sink and not c.attrs.internal:
                    via.add("table sink")
                elif t in (ForeignKeyJoinSubscriptionSender, ForeignKeyJoinResponder):
                    via.add("foreign-key join")
                else:
                    ok = False
        if ok:
            out[src.source_topic] = "last real changes per key (" + (", ".join(sorted(via)) or "no reader") + ")"
    return out


def _last_changes(rows, key_serde=None, value_serde=None):
    """Rows of one table partition in offset order -> the last two real changes of each key, in
    offset order, and every poison record. A real change is what the table source does not skip
    as a no-op (a value whose bytes differ from the key's current ones; a tombstone of a present
    key). The last one gives the store's value and its timestamp (of the last real change); the
    one before it lets a foreign-key join unsubscribe the previous foreign key as a replay of
    every record does. Poison (what the table source would not apply: no key, or bytes that do
    not deserialize with the given serdes) is kept whatever follows it, so the task
    dead-letters it (or fails, or skips it) exactly as a full replay does."""
    keep = _keep_last_changes((([r[3] for r in rows], [r[4] for r in rows], rows),), key_serde, value_serde)
    keep.sort(key=lambda r: r[8])
    return keep


def _keep_last_changes(batches, key_serde, value_serde) -> list:
    """``(keys, values, items)`` batches in offset order -> the items ``_last_changes`` keeps
    (unordered): each key's last two real changes and every poison record. (The backfill's
    hottest loop: every input row of a compacted table passes here once.)"""
    kcheck = key_serde.check if key_serde is not None else None
    vcheck = value_serde.check if value_serde is not None else None
    last: dict = {}           # key -> (item of the change before, item of the last change, its value)
    good_keys: set = set()
    kept = []
    for keys, values, items in batches:
        for k, v, x in zip(keys, values, items):
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


def _defers_emissions(topo, sub) -> bool:
    """Whether a flush (graceful stop) can emit anything in this sub-topology: an aggregate
    under ``Emit.every`` (the only policy that keeps emissions pending)."""
    from processor.graph import AggregateAttrs

    return any(isinstance(n.attrs, AggregateAttrs) and n.attrs.emit.mode == "every"
               for n in topo.subtopologies[sub])


class _RowCollector:
    """A backfill task's collector: internal records become rows for the tasks that read them
    (partition as the worker's producer picks it), everything else an output row."""

    def __init__(self, ctx, task_id, run_no):
        from processor.engine.partitioners import INTERNAL
        from processor.serde import subscription as wire

        self.ctx = ctx
        self.internal_partitioner = INTERNAL
        self.origin = task_id
        self.run_no = run_no
        self.internal: dict[tuple[str, int], list] = {}   # (topic, partition) -> rows, in send order
        self.outputs = {k: [] for k in _SAVED_FIELDS}     # columns of the output rows
        self.seq = 0
        self.phase = 0
        self.internal_counts: dict[str, int] = {}
        # (topic, partition, foreign key, primary key) -> (rows, index) of this run's latest
        # subscription record for that pair (see ``_supersede``)
        self._subscriptions: dict[tuple, tuple[list, int]] = {}
        self.superseded = 0
        self._subscription_pk = wire.subscription_pk
        self._partitions: dict[tuple[str, bytes], int] = {}   # (internal topic, key) -> partition

    def send(self, topic, key, value, timestamp, headers, partition=None):
        if topic in self.ctx.internal:
            if partition is None:
                if key is None:
                    partition = 0
                else:   # (keys repeat: group-by keys above all)
                    partition = self._partitions.get((topic, key))
                    if partition is None:
                        if len(self._partitions) >= 1 << 16:
                            self._partitions.clear()
                        partition = self._partitions[(topic, key)] = self.internal_partitioner.partition(
                            key, self.ctx.counts[topic])
            rows = self.internal.get((topic, partition))
            if rows is None:
                rows = self.internal[(topic, partition)] = []
            if topic in self.ctx.subscription_topics:
                self._supersede(topic, partition, key, value, rows)
            self.internal_counts[topic] = self.internal_counts.get(topic, 0) + 1
            rows.append(("internal", topic, partition, key, value, timestamp, list(headers) if headers else None,
                         self.origin, self.seq, self.phase))
            self.seq += 1
            return
        if topic != self.ctx.dlq and not self.ctx.emit_outputs:
            return   # a sink record: written only with --emit-outputs
        r = self.outputs
        r["kind"].append("output")
        r["topic"].append(topic)
        r["partition"].append(partition)
        r["key"].append(key)
        r["value"].append(value)
        r["ts"].append(timestamp)
        r["headers"].append(None if not headers else [{"key": k, "value": v} for k, v in headers])
        r["origin"].append(self.origin)
        r["seq"].append(self.seq)
        r["phase"].append(self.phase)
        r["run"].append(self.run_no)
        self.seq += 1

    def _supersede(self, topic, partition, fkb, value, rows) -> None:
        """A foreign-key subscription record supersedes this run's earlier one for the same
        (foreign key, primary key), which is then not sent: the right side's subscription store
        ends the same without it (a later subscribe overwrites the entry, a later unsubscribe
        deletes it, whatever the earlier record did), and the response it would cause answers a
        left row that is no longer current (a later left change of that primary key caused the
        later record and holds the version store, so the resolver drops the response as stale).
        Subscription records touch no other state (their sources are not deduplicated, so no
        high-water mark). With each table reduced to its last two changes per key, this halves
        the foreign-key round trips of a backfill."""
        pk = self._subscription_pk(value)
        if pk is None:
            return   # not ours to judge: the receiver stops on it
        pair = (topic, partition, fkb, pk)
        prev = self._subscriptions.get(pair)
        if prev is not None:
            prev_rows, i = prev
            prev_rows[i] = None
            self.internal_counts[topic] -= 1
            self.superseded += 1
        self._subscriptions[pair] = (rows, len(rows))

    def write(self, rows_dir: Path) -> None:
        """Internal rows as one pickle per destination partition
        (``internal/<topic>/<partition>/task-<origin>.pkl``: only this job's tasks read them);
        output rows as Parquet (``output/``: read by Spark at the end)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for (topic, part), rows in self.internal.items():
            if self.superseded:
                rows = [r for r in rows if r is not None]
            if not rows:
                continue
            d = rows_dir / "internal" / topic / str(part)
            d.mkdir(parents=True, exist_ok=True)
            with open(d / f"task-{self.origin}.pkl", "wb") as f:
                pickle.dump(rows, f, protocol=pickle.HIGHEST_PROTOCOL)
        if self.outputs["kind"]:
            d = rows_dir / "output"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pydict(self.outputs, schema=_rows_schema()),
                           str(d / f"task-{self.origin}.parquet"))

    def flush(self):
        pass


_ROWS_ARROW = None


def _rows_schema():
    import pyarrow as pa

    global _ROWS_ARROW
    if _ROWS_ARROW is None:
        _ROWS_ARROW = pa.schema([
            ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("key", pa.binary()),
            ("value", pa.binary()), ("ts", pa.int64()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("origin", pa.string()), ("seq", pa.int64()), ("phase", pa.int32()), ("run", pa.int32())])
    return _ROWS_ARROW


def _load_stores(ctx, task_id):
    from processor.state.memory import MemoryStores

    stores = MemoryStores()
    path = ctx.state_path(task_id)
    offsets: dict = {}
    if path.exists():
        with open(path, "rb") as f:
            saved = pickle.load(f)
        for name, items in saved["stores"].items():
            stores.store(name).put_all(items)
        stores.checkpoint = dict(saved["checkpoint"])
        offsets = saved["offsets"]
    return stores, offsets


def _save_stores(ctx, task_id, stores, offsets) -> None:
    path = ctx.state_path(task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump({"stores": {n: list(s.items()) for n, s in stores.stores.items()},
                     "checkpoint": stores.checkpoint, "offsets": offsets}, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _executor_logging(level: int, json_lines: bool = False) -> None:
    """In an executor's Python worker: log to stderr at the driver's level and format, once per
    process."""
    root = logging.getLogger()
    if not root.handlers:
        if json_lines:
            from processor import logs

            logs.configure(level, "json")
        else:
            logging.basicConfig(level=level, stream=sys.stderr,
                                format=f"%(asctime)s %(levelname)s %(name)s [executor {os.getpid()}]: %(message)s")


class _TaskRun:
    """One run of one sub-topology, for one task (``parallelize(...).map``): its history and the
    internal rows addressed to it -> that task, resumed from its saved stores -> its rows
    (internal, outputs) and saved stores."""

    def __init__(self, ctx, spec):
        self.ctx = ctx
        self.spec = spec

    def __call__(self, partition):
        from processor.errors import ProcessorError

        _executor_logging(self.ctx.log_level, getattr(self.ctx, "log_json", False))
        try:
            return self._run(partition)
        except ProcessorError as exc:   # back to the driver as data: Spark would wrap it
            return {"error": _error_info(exc)}

    def _run(self, partition):
        # No cyclic garbage collection during a run: the task's rows and stores are hundreds of
        # thousands of live objects that every full collection would walk again (measured: the
        # runs of benchmarks/backfill.py took 15 % longer with it); what a run leaves is
        # collected once it is over.
        gc.disable()
        try:
            return self._run_task(partition)
        finally:
            gc.enable()

    def _run_task(self, partition, compact=True, journal=False):
        from processor.engine.task import Task, max_record_bytes_of

        ctx, spec = self.ctx, self.spec
        task_id = f"{spec.sub}_{partition}"
        started = time.monotonic()
        rows, read, replayed = self._input(partition, compact)
        t_read = time.monotonic()
        stores, offsets = _load_stores(ctx, task_id)
        collector = _RowCollector(ctx, task_id, spec.run_no)
        task = Task(ctx.topo, spec.sub, partition, stores, collector, lambda: int(time.time() * 1000),
                    on_error=ctx.on_error, dlq_topic=ctx.dlq, routing=ctx.routing,
                    max_record_bytes=max_record_bytes_of(ctx.producer_config), journal=journal)
        n = 0
        for kind, topic, part, key, value, ts, headers, origin, seq, phase in _merge(rows):
            if kind == "input":
                offset = seq
            else:   # a shuffled internal record: offsets of its (virtual) partition, in arrival order
                offset = offsets.get((topic, part), 0)
                offsets[(topic, part)] = offset + 1
            task.process(topic, part, offset, ts, key, value, headers)
            n += 1
        failed = task.failed_in_processing
        if failed and not journal:
            # A record failed in a user function or an output (under fail, the task raised). The
            # first run keeps no journal to undo a failed record's writes and holds no outputs (a
            # cost on every write): run the task again with them. (Where tables were reduced,
            # the driver then processes the whole history again, record by record: see run().)
            log.warning("task %s: %d record(s) failed in processing (%s): running it again", task_id,
                        sum(failed.values()), ", ".join(f"{t}: {c}" for t, c in sorted(failed.items())))
            task.close()
            return self._run_task(partition, compact=compact, journal=True)
        if spec.flush:
            task.flush()
        # settle the outbox (records sent outside an input record) as a commit would: its records
        # go out now, after everything the run processed (phase 1), and the outbox entry is deleted
        pos, outbox = task.prepare_commit()
        collector.phase = 1
        task.finish_commit(pos, outbox)
        pos, _ = task.prepare_commit()
        task.finish_commit(pos, [])
        t_process = time.monotonic()
        collector.write(ctx.rows_dir(spec.run_no))
        task.close()
        out = {"task": task_id, "records": n, "read": read, "replayed": replayed,
               "internal": collector.internal_counts, "superseded": collector.superseded,
               "dead_lettered": task.dead_lettered, "failed": dict(task.failed_in_processing), "entries": {}}
        if spec.final:
            written = _write_task(ctx, spec.sub, partition, stores, time.monotonic())
            out["entries"] = written["entries"]
        else:
            _save_stores(ctx, task_id, stores, offsets)
        out["seconds"] = {"read": t_read - started, "process": t_process - t_read,
                          "write": time.monotonic() - t_process}
        return out

    def _input(self, partition, compact=True):
        """``(rows, rows read, rows replayed)``: the task's history (archived rows below each
        range, then Kafka's, each partition in offset order; compactable tables reduced) and the
        internal rows of the pending runs."""
        from backfill.range_reader import Range, iter_range

        ctx, spec = self.ctx, self.spec
        rows, read, replayed = [], 0, 0
        counter = _RowCounter(ctx.rows_dir(spec.run_no), f"{spec.sub}_{partition}")

        def counted(batches):
            for msgs in batches:
                counter.add(len(msgs))
                yield msgs

        compacted = ctx.compacted if compact else ()
        for (topic, part), (start, end) in sorted(spec.external.items()):
            if part != partition:
                continue
            split = Range(topic, part, start, end)
            if topic in compacted:
                src = ctx.topo.source_node(topic).attrs
            if topic in compacted and topic not in spec.archives:
                # the common case, streamed: keep only each key's last two real changes
                n, got = _last_changes_of_messages(
                    counted(iter_range(ctx.bootstrap_servers, split, spec.consumer_config)),
                    src.key_serde, src.value_serde)
                read += n
                replayed += len(got)
                rows.extend(got)
                continue
            got = []
            if topic in spec.archives:
                import pyarrow.compute as pc
                import pyarrow.dataset as ds

                arch = ds.dataset(spec.archives[topic], format="parquet")
                flt = (pc.field("topic") == topic) & (pc.field("partition") == part) & (pc.field("offset") < start)
                for b in arch.to_batches(filter=flt):
                    got.extend(_input_rows(b))
                    counter.add(b.num_rows)
            for msgs in counted(iter_range(ctx.bootstrap_servers, split, spec.consumer_config)):
                for m in msgs:
                    got.append(_message_row(m))
            got.sort(key=lambda r: r[8])
            read += len(got)
            if topic in compacted:
                got = _last_changes(got, src.key_serde, src.value_serde)
            replayed += len(got)
            rows.extend(got)
        for run in spec.pending:
            for topic in spec.reads:
                d = ctx.rows_dir(run) / "internal" / topic / str(partition)
                if not d.exists():
                    continue
                for f in sorted(d.glob("*.pkl")):
                    with open(f, "rb") as fh:
                        got = pickle.load(fh)
                    rows.extend(got)
                    counter.add(len(got))
        counter.write()
        return rows, read, replayed


def _message_row(m):
    return ("input", m.topic(), m.partition(), m.key(), m.value(), m.timestamp()[1], m.headers() or None,
            "", m.offset(), 0)


def _last_changes_of_messages(batches, key_serde, value_serde) -> tuple[int, list]:
    """``_last_changes`` over Kafka messages as they are read (offset order): (messages read, the
    kept rows in offset order). Only kept messages become rows."""
    count = [0]

    def columns():
        for msgs in batches:
            count[0] += len(msgs)
            yield [m.key() for m in msgs], [m.value() for m in msgs], msgs

    keep = [_message_row(m) for m in _keep_last_changes(columns(), key_serde, value_serde)]
    keep.sort(key=lambda r: r[8])
    return count[0], keep


def _input_rows(batch):
    """Arrow rows of the Spark kafka schema -> task rows (kind, topic, partition, key, value,
    timestamp ms, headers, origin, seq = offset, phase)."""
    import pyarrow as pa

    n = batch.num_rows
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    topic = batch.column("topic")[0].as_py() if n else None
    part = batch.column("partition")[0].as_py() if n else None
    offsets = batch.column("offset").to_pylist()
    # epoch milliseconds whatever unit the Parquet file holds (Spark writes INT96 by default,
    # which Arrow reads as nanoseconds; TIMESTAMP_MICROS as microseconds)
    col = batch.column("timestamp")
    ts = col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64()).to_pylist()
    headers = batch.column("headers")
    hs = [None] * n if headers.null_count == n else [
        None if h is None else [(x["key"], x["value"]) for x in h] for h in headers.to_pylist()]
    return [("input", topic, part, keys[i], values[i], ts[i], hs[i], "", offsets[i], 0) for i in range(n)]


def _error_info(exc) -> dict:
    return {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}


def _raise_task_errors(results) -> None:
    """A task that failed on purpose (a record under ``--on-error fail``, a user function that
    raised, a partitioning error...) returned its error as data: raise it here, in the driver, as
    the same class of error with the same message and exit code as the worker would."""
    import processor.engine.routing as routing
    import processor.errors as errors

    for r in results:
        info = r.get("error") if isinstance(r, dict) else None
        if info is None:
            continue
        cls = getattr(errors, info["type"], None) or getattr(routing, info["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, errors.ProcessorError)):
            cls = errors.ProcessorError
        exc = cls.__new__(cls)
        Exception.__init__(exc, info["message"])
        exc.exit_code = info["exit_code"]
        raise exc


def _merge(rows):
    """A task's rows of one run: each input stream (an input partition in offset order; an
    internal topic partition from one origin task in send order) as it came; across streams
    phase 0 before phase 1 (records of a flush), then the lowest timestamp first (ties: topic,
    partition, origin)."""
    streams: dict[tuple, list] = {}
    for r in rows:
        if r[0] == "marker":
            continue
        streams.setdefault((r[9], r[1], r[2], r[7]), []).append(r)
    heap = []
    for key, rs in streams.items():
        rs.sort(key=lambda r: r[8])
        heap.append((key[0], rs[0][5] if rs[0][5] is not None else 0, key[1], key[2], key[3], 0))
    heapq.heapify(heap)
    while heap:
        phase, _, topic, part, origin, i = heapq.heappop(heap)
        rs = streams[(phase, topic, part, origin)]
        yield rs[i]
        if i + 1 < len(rs):
            nxt = rs[i + 1][5]
            heapq.heappush(heap, (phase, nxt if nxt is not None else 0, topic, part, origin, i + 1))


# -- writing: every task's database and changelogs -------------------------------------------------
def _finalize(spark, ctx, finalized: set) -> dict[str, int]:
    """Every task of every sub-topology not in ``finalized`` (with or without records; those
    of ``finalized`` were written by their last run): positions, changelogs, commit record,
    database under the build root. Returns entries per store."""
    tasks = [(sub, p) for sub in range(len(ctx.topo.subtopologies)) if sub not in finalized
             for p in range(ctx.tasks_of(sub))]
    if not tasks:
        return {}
    with _StageProgress(spark, f"writing {len(tasks)} task database(s) and changelogs"):
        results = spark.sparkContext.parallelize(tasks, max(1, min(len(tasks), 64))).map(
            _FinalizeTask(ctx)).collect()
    _raise_task_errors(results)
    total: dict[str, int] = {}
    for r in results:
        for store, n in r["entries"].items():
            total[store] = total.get(store, 0) + n
    secs = {k: sum(r["seconds"][k] for r in results) for k in ("load", "changelogs", "database")}
    log.info("backfill: %d task database(s) and changelogs written (in the tasks: loading %.1f s, changelogs "
             "%.1f s, databases %.1f s)", len(results), secs["load"], secs["changelogs"], secs["database"])
    return total


class _FinalizeTask:
    """A task that no run wrote (``parallelize(...).map``): its saved stores (none: empty) ->
    ``_write_task``."""

    def __init__(self, ctx):
        self.ctx = ctx

    def __call__(self, key):
        from processor.errors import ProcessorError

        try:
            sub, partition = key
            t0 = time.monotonic()
            stores, _ = _load_stores(self.ctx, f"{sub}_{partition}")
            return _write_task(self.ctx, sub, partition, stores, t0)
        except ProcessorError as exc:
            return {"error": _error_info(exc)}


def _write_task(ctx, sub, partition, stores, t0) -> dict:
    """A task's final stores -> its changelogs, commit record and database under the build root
    (positions: the snapshot for sources, the end now for internal topics). Returns entries per
    contract store and seconds (``load``: from ``t0`` to the changelogs)."""
    from processor import provenance
    from processor.runtime import kafka
    from processor.state import commit_record
    from processor.state.store import BOOKKEEPING_STORE, TASK_STORE

    from backfill.sst import build_task_database, task_dir_name

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
            entries = entries + [(k, None) for k in _existing_keys(ctx.bootstrap_servers, topic, partition,
                                                                    before) if k not in ours]
        writes[(topic, partition)] = (entries, before)
    t1 = time.monotonic()
    ends = _produce_all(producer, writes)          # every store changelog, one flush
    task_topic = changelogs[TASK_STORE]
    record = commit_record.encode(commit_record.CommitRecord(1, positions, ends))
    task_entries = contents[TASK_STORE]
    before = ctx.changelog_ends.get((task_topic, partition), 0)
    if before:   # an earlier run's units (a worker's, a killed backfill's): their keys end here too
        ours = {k for k, _ in task_entries}
        task_entries = task_entries + [(k, None) for k in _existing_keys(ctx.bootstrap_servers, task_topic,
                                                                          partition, before)
                                       if k not in ours and k != commit_record.COMMIT_KEY]
    task_end = _produce_all(producer, {(task_topic, partition): (
        task_entries + [(commit_record.COMMIT_KEY, record)], 0)})[(task_topic, partition)]
    contents[TASK_STORE] = sorted(dict(contents[TASK_STORE] + [(commit_record.COMMIT_KEY, record)]).items())
    checkpoint = {**positions, **ends, (task_topic, partition): task_end}
    t2 = time.monotonic()
    build_task_database(Path(ctx.build_root) / task_dir_name(sub, partition), contents, checkpoint)
    return {"entries": {name: len(v) for name, v in contents.items() if not name.startswith("__")},
            "seconds": {"load": t1 - t0, "changelogs": t2 - t1, "database": time.monotonic() - t2}}


def _existing_keys(bootstrap_servers, topic, partition, end) -> list[bytes]:
    """The keys of ``topic[partition]`` below ``end`` (a changelog an earlier run wrote)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from processor.runtime import kafka

    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update({"group.id": f"backfill-keys-{time.time_ns()}", "fetch.wait.max.ms": 50})
    c = kafka.new_consumer(conf, f"reading the keys of changelog {topic}[{partition}]")
    keys: dict[bytes, None] = {}
    try:
        kafka.assign(c, [TopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    if m.key() is not None:
                        keys[m.key()] = None
                    if m.offset() + 1 >= end:
                        return list(keys)
                elif m.error().code() == m.error()._PARTITION_EOF:
                    return list(keys)
        raise ConfigError(f"backfill: reading the earlier records of {topic}[{partition}] did not finish in 60 s")
    finally:
        c.close()


def _produce_all(producer, writes: dict) -> dict:
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


# -- outputs ----------------------------------------------------------------------------------------
def _table_sinks(topo) -> set[str]:
    """Sink topics fed straight by a table's ``to_stream()``: they carry a table, so the history's
    result is the last record per key."""
    from processor.graph import ToStreamAttrs

    out = set()
    for n in topo.nodes:
        if n.sink_topic and not n.attrs.internal and n.parents and \
                all(isinstance(p.attrs, ToStreamAttrs) for p in n.parents):
            out.add(n.sink_topic)
    return out


def _emit(spark, ctx, emit_outputs: bool) -> tuple[int, int]:
    """Produce the output rows: dead-letter records always (the on-error policy), sink records
    with ``emit_outputs`` (table sinks: last record per key). Returns (outputs, dead-lettered)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    from processor.runtime import kafka

    rows_root = Path(ctx.build_root) / "rows"
    if not rows_root.exists() or not any(rows_root.glob("run-*/output/*.parquet")):
        return 0, 0
    rows = spark.read.parquet(str(rows_root / "run-*" / "output")).where(F.col("kind") == "output")
    dlq = rows.where(F.col("topic") == ctx.dlq)
    selected = dlq
    if emit_outputs:
        sinks = rows.where(F.col("topic") != ctx.dlq)
        tables = sorted(_table_sinks(ctx.topo))
        streams = sinks.where(~F.col("topic").isin(tables)) if tables else sinks
        last = Window.partitionBy("topic", "key").orderBy(F.col("run").desc(), F.col("seq").desc())
        table_rows = (sinks.where(F.col("topic").isin(tables)).withColumn("_n", F.row_number().over(last))
                      .where(F.col("_n") == 1).drop("_n")) if tables else None
        selected = selected.unionByName(streams)
        if table_rows is not None:
            selected = selected.unionByName(table_rows)
    producer = kafka.new_producer({**kafka.producer_defaults(ctx.bootstrap_servers), **ctx.producer_config},
                                  "backfill outputs")
    outputs = dead = 0
    errors = []
    for r in selected.orderBy("run", "origin", "seq").toLocalIterator():
        kw = {"timestamp": r.ts, "on_delivery": lambda err, msg: errors.append(err.str()) if err else None}
        if r.headers:
            kw["headers"] = [(h.key, h.value) for h in r.headers]
        if r.partition is not None:
            kw["partition"] = r.partition
        while True:
            try:
                producer.produce(r.topic, r.value, r.key, **kw)
                break
            except BufferError:
                producer.poll(0.05)
        if r.topic == ctx.dlq:
            dead += 1
        else:
            outputs += 1
    if producer.flush(120):
        raise ConfigError("backfill: output records not delivered within 120 s")
    if errors:
        raise ConfigError(f"backfill: {len(errors)} output record(s) failed, first: {errors[0]}")
    return outputs, dead


def _commit_group_offsets(bootstrap_servers, application_id, snapshot, internal_ends, consumer_config) -> None:
    from confluent_kafka import TopicPartition

    from processor.runtime import kafka

    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update(consumer_config or {})
    conf["group.id"] = application_id
    c = kafka.new_consumer(conf, "committing the group's offsets at the snapshot")
    try:
        offsets = [TopicPartition(t, p, e) for (t, p), (_, e) in sorted(snapshot.items())]
        offsets += [TopicPartition(t, p, e) for (t, p), e in sorted(internal_ends.items()) if e > 0]
        if offsets:
            c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()
