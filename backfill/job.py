"""The backfill job: topic history -> the topology's own tasks in Spark executors -> the
changelogs, commit records and group offsets a worker on any machine continues from (and, with a
``--state-dir``, the worker's layout on the driver's machine) -> ``processor run`` continues at
the snapshot.

The stages, each in its own module (docs/architecture.md's backfill flow is the map):

==========================  =====================================================================
``backfill.job``            ``run``: the stages below in order (``BackfillJob``), and the report
``backfill.session``        the Spark session, its settings and executors
``backfill.code_shipping``  the topology's code, shipped to the executors
``backfill.snapshot``       1. the end offset of every partition involved
``backfill.range_reader``   2. history below it, read by each task from Kafka (``kafka_source``: the
                            same ranges as a Spark data source), archives below Kafka's retention
``backfill.compaction``     3. table sources reduced to their last real changes where sound
``backfill.plan``           the order of runs; which run is a sub-topology's last
``backfill.runs``           4. the runs in Spark: stores and internal rows between them as Spark data
``backfill.task_run``       one task's run in an executor (the shared engine's ``Task``)
``backfill.rows``           what a task reads and sends, and the order it processes them in
``backfill.items``          the items of a run's result: what passes between tasks and runs
``backfill.handoff``        5. changelogs, commit records, group offsets; the driver's databases
``backfill.sst``            the worker's RocksDB layout through SST files, installed all or nothing
``backfill.outputs``        outputs and dead letters, produced once at the end
``backfill.progress``       progress bars
==========================  =====================================================================

Invariants:

- **One engine.** Executors run ``processor.engine.task.Task`` over the topology's own operators
  (what the worker and ``TopologyTestDriver`` run) with in-memory stores. A task gets its
  records in offset order per input partition; across a task's inputs, the record with the
  lowest timestamp goes first (ties: topic, partition), as Kafka Streams picks.
- **Internal topics are shuffles.** What a task sends to an internal topic (repartition,
  foreign-key subscription/response) becomes a row for the task that reads it, routed exactly as
  the worker routes it, with the same headers (provenance). Sub-topologies run in *runs*: one
  Spark job per sub-topology that has input, in topological order, repeated until no row is
  pending (a foreign-key join's cycle, left -> right -> left, takes three runs). A task's stores
  and the rows between runs move as Spark data, never through an executor's files
  (``backfill.runs``). Then each sub-topology is flushed once (as a graceful stop does), and
  what that sends is processed too.
- **Exactly the snapshot.** The end offset of every source partition is taken first (fetch high
  watermark, ``backfill.snapshot``), at the isolation level of the worker that continues
  (``read_committed`` under ``processing_guarantee="exactly_once"``: below an open transaction);
  exactly the history below it is read, at the same level (plus ``--archive`` Parquet below the
  earliest offset Kafka holds); the checkpoint, the commit record and the group offsets say
  "next offset = snapshot end", and for internal topics "= their end now" (the shuffles never
  went through them). So a worker started after the backfill processes no record below the
  snapshot again and skips none above it.
- **The hand-off.** Each store's final contents go to its changelog partition, then a commit
  record to the task changelog, as a worker's commit unit leaves them: a worker anywhere restores
  the same state from them. With a ``state_dir``, the task databases are also built on the driver
  from data that reached it through Spark and moved into ``<state-dir>/<application-id>/`` only
  at the end: a failure or a kill leaves no state there, and a re-run starts afresh (a killed
  run's build root is removed by the next). The group offsets are committed last.
- **The build is named.** Each task run reports its executor's ``processor._compiled.build_info()``
  (the executors run the project their environment installed; only user modules are shipped):
  the report's ``build:`` line names the driver's build and the executors', any executor running
  a module as Python as a "pure Python fallback" with its count, and a warning says so once per
  backfill (docs/compiled.md "Spark executors").
- **Outputs.** Without ``emit_outputs`` no sink is written (the outputs are assumed to exist).
  With it, each sink receives the history's result once (``backfill.outputs``). Dead-letter
  records follow the topology's ``on_error`` policy as in the worker, produced once.

Where the stores can differ from a live worker's (docs/backfill.md "Same stores"): high-water marks of
internal records whose source is itself an internal topic are not kept (those records never
existed in Kafka, so none can be replayed); ``Emit.every(clock="wall")`` records wall-clock
emission times.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill.compaction import compaction_plan, last_changes  # noqa: F401 (the job's public names)
from backfill.items import RunRecord
from processor.config import StreamsConfig
from processor.engine.task_id import DIR_GLOB
from processor.errors import ConfigError

if TYPE_CHECKING:
    from backfill.context import JobContext
    from backfill.runs import Runs
    from backfill.session import WarmUp
    from processor.kafka.startup_checks import TopicPlan

log = logging.getLogger("processor.backfill")


def _build_info() -> str:
    from processor._compiled import build_info

    return build_info()

EXECUTOR_TIMEOUT_S = 120.0    # how long a cluster may take to give the job its first executor

@dataclass
class BackfillReport:
    """What a backfill did (``run`` returns it; ``lines`` is how it logs it)."""
    application_id: str
    snapshot: dict[tuple[str, int], tuple[int, int]]   # (topic, partition) -> (start, end)
    rows_read: int = 0                           # input records read from history
    rows_replayed: int = 0                       # of those, fed to the tasks (after compaction)
    # source topic -> mode (docs/backfill.md "What it does", step 4)
    compaction: dict[str, str] = field(default_factory=dict)
    global_records: int = 0                      # global table records read (to the snapshot)
    global_latest: dict[str, int] = field(default_factory=dict)   # global store -> the latest timestamp applied
    records_processed: int = 0                   # every record a task processed (incl. internal)
    rows_per_store: dict[str, int] = field(default_factory=dict)   # store -> entries (all tasks)
    tasks: int = 0
    runs: list[RunRecord] = field(default_factory=list)   # the runs in order
    outputs_emitted: int = 0
    dead_lettered: int = 0
    fk_records_superseded: int = 0               # foreign-key join records not sent (RowCollector._supersede)
    unordered: list[str] = field(default_factory=list)   # reduced sources' partitions replayed whole (in_time_order)
    seconds: dict[str, float] = field(default_factory=dict)   # stage -> seconds
    installed: list[str] = field(default_factory=list)   # the task directories installed
    finalized: set[int] = field(default_factory=set)   # sub-topologies whose tasks were written by their last run
    # input topic -> records failed in processing (a user function, an output)
    failed_in_processing: dict[str, int] = field(default_factory=dict)
    # which build of the per-record path ran (processor/_compiled.py, docs/compiled.md): the
    # driver's, and per distinct executor line the task runs that reported it
    driver_build: str = field(default_factory=lambda: _build_info())
    executor_builds: dict[str, int] = field(default_factory=dict)

    # what one attempt at processing records (``backfill.runs.process``); a retry starts them over
    # (``start_over``). ``executor_builds`` is not among them: it counts every task run of the job.
    ATTEMPT_FIELDS = ("rows_read", "rows_replayed", "records_processed", "rows_per_store", "runs",
                      "fk_records_superseded", "unordered", "finalized", "failed_in_processing")

    def start_over(self) -> None:
        """Forget what an attempt at processing recorded: each of ``ATTEMPT_FIELDS`` back to its
        default (the retry that replays every record fills them again)."""
        for f in fields(self):
            if f.name in self.ATTEMPT_FIELDS:
                setattr(self, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)

    def build_line(self) -> str:
        """``build: driver <line>; executors <line> (<n> task runs)``; executors whose line names a
        module run as Python (``processor._compiled.falls_back``) are listed as ``executors: pure
        Python fallback on <k> of <n> task runs: <line>``, after the others."""
        from processor._compiled import falls_back

        total = sum(self.executor_builds.values())
        parts = [f"executors: pure Python fallback on {n} of {total} task run{'s' if total != 1 else ''}: {b}"
                 if falls_back(b) else f"executors {b} ({n} task run{'s' if n != 1 else ''})"
                 for b, n in sorted(self.executor_builds.items(), key=lambda kv: (falls_back(kv[0]), -kv[1], kv[0]))]
        return f"build: driver {self.driver_build}; {'; '.join(parts) or 'executors none reported'}"

    def executors_fall_back(self) -> int:
        """The task runs whose executor ran a module of the per-record path as Python, other
        than as the driver runs it (0: none). An executor compiled by another Cython version is
        no fallback; one whose build is the driver's own fallback is not counted (the report
        names both)."""
        from processor._compiled import falls_back

        return sum(n for b, n in self.executor_builds.items() if falls_back(b) and b != self.driver_build)

    def lines(self) -> list[str]:
        out = [f"backfill of {self.application_id}: {self.rows_read} input rows read, {self.records_processed} "
               f"records processed in {len(self.runs)} run(s), {self.tasks} task(s) written, "
               f"{self.outputs_emitted} output record(s) emitted, {self.dead_lettered} dead-lettered"]
        for (t, p), (s, e) in sorted(self.snapshot.items()):
            out.append(f"  snapshot {t}[{p}]: offsets [{s}, {e})")
        for t, mode in sorted(self.compaction.items()):
            out.append(f"  source {t}: {mode}")
        out.append(f"  rows read {self.rows_read}, replayed after compaction {self.rows_replayed}")
        if self.unordered:
            out.append(f"  replayed whole, their timestamps going backwards: {', '.join(sorted(self.unordered))}")
        if self.global_records:
            latest = ", ".join(f"{n} at {ts}" for n, ts in sorted(self.global_latest.items()))
            out.append(f"  global tables: {self.global_records} records read to the snapshot, the same table "
                       f"given to every task (their last changes: {latest or 'none'}; an older record joins the "
                       f"table as of the snapshot)")
        if self.fk_records_superseded:
            out.append(f"  foreign-key join records superseded within a run (not sent): "
                       f"{self.fk_records_superseded}")
        for r in self.runs:
            out.append(f"  run: sub-topology {r.sub_topology}{' (flush)' if r.flush else ''}: {r.records} records, "
                       f"{r.seconds:.1f} s")
        for store, n in sorted(self.rows_per_store.items()):
            out.append(f"  store {store}: {n} entries")
        out.append(f"  {self.build_line()}")
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        rate = (f"; {self.rows_read / self.seconds['process']:.0f} input rows/s in the process stage"
                if self.seconds.get("process") else "")
        out.append(f"  seconds: {stages} (total {sum(self.seconds.values()):.1f} s){rate}")
        return out



def _refuse_existing(bootstrap_servers, application_id, state_dir: Path | None, topics, counts,
                     consumer_config) -> None:
    from confluent_kafka import TopicPartition

    from processor.kafka import clients as kafka

    target = state_dir / application_id if state_dir is not None else None
    existing = sorted(p.name for p in target.glob(DIR_GLOB)) if target is not None and target.exists() else []
    if existing:
        raise ConfigError(f"state directory {target} already holds state of application "
                          f"{application_id!r} ({', '.join(existing[:4])}{'...' if len(existing) > 4 else ''}); "
                          f"pass --force to replace it")
    conf = kafka.consumer_defaults(bootstrap_servers)
    conf.update(consumer_config or {})
    conf["group.id"] = application_id
    c = kafka.new_consumer(conf, "checking the group's committed offsets")
    partitions = [TopicPartition(t, p) for t in topics for p in range(counts[t])]
    try:
        # a group coordinator not loaded yet (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS on
        # Apache Kafka) is retried as the worker retries it (kafka.retry_transient)
        committed = kafka.retry_transient(lambda: kafka.raise_partition_error(c.committed(partitions, timeout=30)),
                                          f"reading the committed offsets of group {application_id!r}")
    finally:
        c.close()
    done = [f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in committed if tp.offset >= 0]
    if done:
        raise ConfigError(f"consumer group {application_id!r} has committed offsets ({', '.join(done[:4])}"
                          f"{'...' if len(done) > 4 else ''}): the application already ran; pass --force "
                          f"to backfill over it")



@dataclass
class ClientSettings:
    """The job's client settings, as every client of the driver and (through the job context) of
    the executors gets them: the cluster with its settings, the consumers' (at the isolation level
    of the worker that continues) and the producers'; the partitioner sampling's own consumer
    settings (``read_uncommitted`` unless the user gave a level, as the worker samples)."""
    bootstrap_servers: Any             # a processor.kafka.clients.KafkaCluster
    consumer_config: dict | None
    producer_config: dict | None
    sampling_config: dict
    registry: Any                      # the Schema Registry settings (ClientConfig.registry)


def client_settings(bootstrap_servers, settings: StreamsConfig) -> ClientSettings:
    """The job's client settings (``ClientSettings``) from the validated ``settings``."""
    from processor.kafka import clients as kafka

    # partitioner detection samples as the worker does: at the level the user gave, else
    # read_uncommitted (processor/kafka/partitioning.py), so both decide on the same records
    sampling_config = {"isolation.level": "read_uncommitted", **settings.clients.for_kind("consumer")}
    # every other consumer below reads at the worker's isolation level (StreamsConfig.isolation_level)
    clients = settings.clients_at_isolation_level()
    # every client below, in the driver and (through the job context) the executors, gets them
    bootstrap_servers = kafka.cluster_of(bootstrap_servers, clients)
    consumer_config = clients.for_kind("consumer") or None
    producer_config = clients.for_kind("producer") or None
    return ClientSettings(bootstrap_servers, consumer_config, producer_config, sampling_config, clients.registry)


@dataclass
class Snapshot:
    """Where every partition the job involves ends (``snapshot_offsets``), taken once, and the
    partitioners sampled meanwhile."""
    everything: dict           # (topic, partition) -> (start, end): every partition involved
    sources: dict              # (source topic, partition) -> (start, end): the history to read
    internal_ends: dict        # (internal topic, partition) -> end
    changelog_ends: dict       # (changelog topic, partition) -> end before the backfill
    user_sinks: list           # the user's sink topics (--emit-outputs), else []
    choices: dict              # source topic -> PartitionerChoice


class BackfillJob:
    """One backfill, stage by stage (``run`` calls them in order). It keeps what later stages need
    of earlier ones (the application's topology, the partition counts, the topics created, the
    session, the build root, the runs); the snapshot, the job context and the report are passed
    from stage to stage. Invariant: whatever a stage opens (the session the job creates, the
    build root, the warm-up, the runs' Spark data) is kept here as soon as it exists, so that
    ``close`` (``run``'s ``finally``) releases it whatever failed."""

    def __init__(self, topology, clients: ClientSettings, application_id: str, state_dir, emit_outputs: bool,
                 archives: dict | None, force: bool, on_error: str, compaction: bool):
        self.clients = clients
        self.bootstrap_servers = clients.bootstrap_servers
        self.consumer_config = clients.consumer_config
        self.application_id = application_id
        self.emit_outputs = emit_outputs
        self.archives = archives
        self.force = force
        self.on_error = on_error
        self.compaction = compaction
        self.seconds: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.topo = topology.for_application(application_id, clients.registry)   # registry serdes: their settings
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.counts: dict[str, int] = {}
        self.sources: list[str] = []
        self.internal_counts: dict[str, int] = {}
        self.plan: TopicPlan | None = None   # (check)
        self.changelog_topics: dict = {}
        self.dlq = ""
        self.spark = None
        self.own_session = False
        self.build_root: Path | None = None
        self.warm_up: WarmUp | None = None
        self.spark_runs: Runs | None = None

    def check(self) -> None:
        """Before anything starts: the serdes' settings, the topics the topology reads (and writes,
        with ``emit_outputs``), the archives, co-partitioning; unless ``force``, no state of the
        application in the state directory and no committed offsets of its group. A killed run's
        build root is removed."""
        from processor.kafka import startup_checks

        topo, bootstrap_servers, application_id = self.topo, self.bootstrap_servers, self.application_id
        emit_outputs, archives, state_dir = self.emit_outputs, self.archives, self.state_dir
        topo.check_serde_settings()
        # the start-up routine's first step, as the worker's (processor/kafka/startup_checks.py):
        # topics, existing internal topics, co-partitioning; nothing changes on the broker
        plan = self.plan = startup_checks.check_topics(bootstrap_servers, topo, application_id, "backfilling",
                                                       sinks=emit_outputs)
        counts = self.counts = plan.counts
        sources = self.sources = list(dict.fromkeys(topo.external_source_topics()))
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
        if not self.force:
            _refuse_existing(bootstrap_servers, application_id, state_dir, sources, counts, self.consumer_config)
        if state_dir is not None:
            for stale in state_dir.glob(f"{application_id}.backfill-tmp-*"):   # a killed run's leftovers
                shutil.rmtree(stale, ignore_errors=True)

    def warn_what_a_replay_cannot_reproduce(self) -> None:
        """A warning naming each user processor: its wall-clock punctuations do not fire."""
        from processor.graph import UserProcessorAttrs

        for n in self.topo.nodes:   # what a replay cannot reproduce, named (docs/dsl.md "Not supported")
            if isinstance(n.attrs, UserProcessorAttrs):
                log.warning("backfill: %s is a user processor: its wall-clock punctuations, if it schedules any, "
                            "do not fire in a backfill (a replay takes none of the history's wall-clock time)",
                            n.name)

    def open_session(self, spark, master: str | None, spark_conf: dict | None):
        """The Spark session: the one given, or one the job creates (and stops in ``close``). Then
        the driver's own files: the build root (task databases built here, then installed) under
        the state directory, or a temporary directory (shipped code, progress counters)."""
        from backfill import session
        from backfill.sst import new_build_root

        self.own_session = spark is None
        if self.own_session:
            t_session = time.monotonic()
            spark = session.spark_session(master, spark_conf)
            self.seconds["spark session"] = time.monotonic() - t_session
            self.t0 = time.monotonic()
        elif spark_conf:
            log.warning("backfill: spark_conf ignored: the session was given (%s)", ", ".join(sorted(spark_conf)))
        self.spark = spark
        state_dir, application_id = self.state_dir, self.application_id
        self.build_root = new_build_root(state_dir, application_id) if state_dir is not None else \
            Path(tempfile.mkdtemp(prefix=f"{application_id}.backfill-tmp-"))
        return spark

    def start_executors(self, to_ship: list, executor_timeout_s: float) -> None:
        """Executors registered, the topology's code shipped to them, and their Python workers
        importing the engine (``session.WarmUp``) while the driver takes the snapshot."""
        from backfill import code_shipping, session

        spark = self.spark
        assert spark is not None and self.build_root is not None
        executors = session.wait_for_executors(spark, executor_timeout_s)
        if executors:
            log.info("backfill: %d executor(s) on %s", executors, spark.sparkContext.master)
        code_shipping.ship(spark, to_ship, str(self.build_root / "py-files"))
        # the executors' Python workers start and import the engine while the driver takes the snapshot
        self.warm_up = session.WarmUp(spark)

    def join_warm_up(self) -> None:
        """The executors' warm-up over (its failure logged: ``session.WarmUp``)."""
        if self.warm_up is not None:
            self.warm_up.join()

    def create_topics(self, replication_factor: int | None, topic_configs: dict | None) -> None:
        """1. The internal topics as the worker creates them (the start-up routine's second step,
        ``processor/kafka/startup_checks.py``), the dead-letter topic under ``on_error="dlq"``;
        their partition counts join ``counts``."""
        from processor.engine.task import dlq_topic_for
        from processor.kafka import startup_checks

        dlq = self.dlq = dlq_topic_for(self.application_id)
        assert self.plan is not None, "check() comes first"
        self.counts = startup_checks.create_topics(self.bootstrap_servers, self.topo, self.plan,
                                                   replication_factor=replication_factor, topic_configs=topic_configs,
                                                   on_error=self.on_error, dead_letter_topic=dlq)
        self.internal_counts = dict(self.plan.internal)
        self.changelog_topics = self.topo.changelog_topic_partitions(self.counts)

    def take_snapshot(self) -> Snapshot:
        """One snapshot of every partition involved: the sources' history, and where the internal
        and changelog topics end (new topics: 0); the partitioners are sampled meanwhile (both
        wait on the broker, not the CPU). The topology takes the partitioners found."""
        from backfill.snapshot import snapshot_offsets
        from processor.kafka.partitioning import determine_partitioners

        topo, sources, internal_counts = self.topo, self.sources, self.internal_counts
        changelog_topics = self.changelog_topics
        with ThreadPoolExecutor(1) as pool:
            sampling = pool.submit(determine_partitioners, topo, self.bootstrap_servers, dict(self.counts),
                                   self.clients.sampling_config, self.application_id)
            user_sinks = topo.sink_topics(internal=False) if self.emit_outputs else []
            everything = snapshot_offsets(self.bootstrap_servers,
                                          sources + list(internal_counts) + list(changelog_topics) + user_sinks
                                          + topo.global_topics(), consumer_config=self.consumer_config)
            choices = sampling.result()
        snapshot = {tp: r for tp, r in everything.items() if tp[0] in set(sources)}
        internal_ends = {tp: e for tp, (_, e) in everything.items() if tp[0] in internal_counts}
        changelog_ends = {tp: e for tp, (_, e) in everything.items() if tp[0] in changelog_topics}
        if any(changelog_ends.values()):   # a killed backfill, or --force over an earlier run
            log.info("changelog topics already hold records: keys the backfill does not write get tombstones")
        self.topo = topo.with_partitioning(choices)
        self.seconds["snapshot"] = time.monotonic() - self.t0
        for (t, p), (s, e) in sorted(snapshot.items()):
            log.info("snapshot %s[%d]: offsets [%d, %d)", t, p, s, e)
        return Snapshot(everything, snapshot, internal_ends, changelog_ends, user_sinks, choices)

    def job_context(self, snap: Snapshot, report: BackfillReport) -> JobContext:
        """What every Spark task gets: the topology, the routing, the snapshot, the global tables
        at the snapshot (the same for every task), the user sinks' ends and the compaction plan
        (docs/backfill.md)."""
        from backfill import handoff, session
        from backfill.context import JobContext
        from processor.engine.routing import Routing

        topo, bootstrap_servers, counts, sources = self.topo, self.bootstrap_servers, self.counts, self.sources
        emit_outputs, compaction, everything, user_sinks = self.emit_outputs, self.compaction, snap.everything, \
            snap.user_sinks
        assert self.build_root is not None
        ctx = JobContext(topo, Routing(snap.choices, counts), counts, bootstrap_servers, self.on_error, self.dlq,
                         self.clients.producer_config or {}, emit_outputs, build_databases=self.state_dir is not None,
                         local_root=str(self.build_root) if session.is_local(self.spark) else None)
        ctx.snapshot, ctx.internal_ends, ctx.changelog_ends = snap.sources, snap.internal_ends, snap.changelog_ends
        if topo.global_stores:   # every task gets the same global tables: their topics at the snapshot
            ctx.global_tables, report.global_records, report.global_latest = handoff.read_global_tables(
                bootstrap_servers, topo, everything, self.consumer_config)
            for name, ts in sorted(report.global_latest.items()):
                log.warning("backfill: global table %s last changed at timestamp %d: every task joins it as of the "
                            "snapshot, so a record older than that joins the table as it is now, not as it was "
                            "(a worker started at the snapshot does the same; docs/dsl.md \"Not supported\")", name, ts)
        # the user sink topics' ends (--emit-outputs): a table sink gets a tombstone only for a
        # key it already holds
        ctx.output_ends = {tp: r for tp, r in everything.items() if tp[0] in user_sinks}
        held = {tp[0] for tp, (s, e) in everything.items() if tp[0] in user_sinks and e > s}
        refusals: dict = {}
        plan = compaction_plan(topo, emit_outputs, held_outputs=held, refusals=refusals) if compaction else {}
        ctx.compacted = set(plan)
        report.compaction = {t: plan.get(t) or refusals.get(t)
                             or ("every record replayed (a stream: each record is an event)" if compaction
                                 else "every record replayed (--no-compaction)") for t in sources}
        return ctx

    def process(self, ctx: JobContext, snap: Snapshot, report: BackfillReport) -> Runs:
        """2.-4. The runs (``backfill.runs``). Where tables were reduced and records failed in
        processing, everything is done again, every record replayed."""
        from backfill import runs
        from backfill.snapshot import snapshot_offsets

        spark, archives, consumer_config = self.spark, self.archives, self.consumer_config
        snapshot, sources = snap.sources, self.sources
        t1 = time.monotonic()
        spark_runs = self.spark_runs = runs.open_runs(spark, ctx)
        runs.process(spark_runs, snapshot, archives, consumer_config, report)
        if ctx.compacted and report.failed_in_processing:
            # Records failed in user functions or outputs while tables were reduced: the worker
            # dead-letters (or skips) each failing record of the whole history and keeps the
            # previous value of its key, which a reduction cannot reproduce where the failure
            # shows downstream (e.g. a foreign-key join's joiner on a reduced right table). So
            # everything is done again, every record replayed.
            failed = ", ".join(f"{t}: {c}" for t, c in sorted(report.failed_in_processing.items()))
            log.warning("records failed in processing (%s) while tables were reduced to their last "
                        "changes: processing the history again, record by record", failed)
            spark_runs.discard()
            # the first attempt's last runs wrote changelogs: where they end now is what the
            # second attempt tombstones below (keys it does not write must not survive there)
            ctx.changelog_ends = {tp: e for tp, (_, e) in snapshot_offsets(
                self.bootstrap_servers, list(self.changelog_topics), consumer_config=consumer_config).items()}
            ctx.compacted = set()
            report.compaction = {t: f"every record replayed (records failed in processing: {failed})"
                                 for t in sources}
            report.start_over()
            spark_runs = self.spark_runs = runs.open_runs(spark, ctx)
            runs.process(spark_runs, snapshot, archives, consumer_config, report)
        self.seconds["process"] = time.monotonic() - t1
        return spark_runs

    def write_changelogs(self, spark_runs: Runs, report: BackfillReport) -> None:
        """5. The changelogs and commit records of every task its last run did not write."""
        from backfill import runs

        t2 = time.monotonic()
        stats = runs.finalize(spark_runs, report.finalized)
        for store, n in stats.items():
            report.rows_per_store[store] = report.rows_per_store.get(store, 0) + n
        report.tasks = sum(spark_runs.ctx.tasks_of(sub) for sub in range(len(self.topo.subtopologies)))
        self.seconds["changelogs"] = time.monotonic() - t2

    def emit_outputs_once(self, ctx: JobContext, spark_runs: Runs, report: BackfillReport) -> None:
        """The outputs (``emit_outputs``) and dead letters, produced once (``backfill.outputs``)."""
        from backfill import outputs

        t3 = time.monotonic()
        report.outputs_emitted, report.dead_lettered = outputs.emit(self.spark, ctx, spark_runs.items("output"),
                                                                    self.emit_outputs)
        self.seconds["outputs"] = time.monotonic() - t3

    def hand_over(self, spark_runs: Runs, snap: Snapshot, report: BackfillReport) -> None:
        """The hand-off: with a state directory, the task databases built and installed there all
        or nothing; then the group offsets, last."""
        from backfill import handoff
        from backfill.sst import install_task_databases

        state_dir, build_root = self.state_dir, self.build_root
        assert build_root is not None
        t4 = time.monotonic()
        if state_dir is not None:
            built = spark_runs.build_databases(build_root)
            if built != report.tasks:
                raise RuntimeError(f"backfill: internal error: {built} task databases came back, not {report.tasks}")
            for scratch in ("py-files", "progress", "staging"):
                shutil.rmtree(build_root / scratch, ignore_errors=True)
            report.installed = [str(p) for p in install_task_databases(build_root, state_dir, self.application_id,
                                                                       force=self.force)]
        handoff.commit_group_offsets(self.bootstrap_servers, self.application_id, snap.sources, snap.internal_ends,
                                     self.consumer_config)
        self.seconds["install"] = time.monotonic() - t4

    def close(self) -> None:
        """Whatever happened: the warm-up joined, the runs' Spark data released, the build root
        removed, and the session stopped if the job created it."""
        if self.warm_up is not None:
            self.warm_up.join()
        if self.spark_runs is not None:
            self.spark_runs.close()
        if self.build_root is not None and self.build_root.exists():
            shutil.rmtree(self.build_root, ignore_errors=True)
        if self.own_session and self.spark is not None:
            self.spark.stop()


def run(topology, bootstrap_servers: str, application_id: str, state_dir=None, spark=None,
        emit_outputs: bool = False, archives: dict | None = None, force: bool = False,
        master: str | None = None, on_error: str = "dlq", consumer_config: dict | None = None,
        producer_config: dict | None = None, max_records_per_split: int | None = None,
        client_config=None, replication_factor: int | None = None,
        topic_configs: dict | None = None, processing_guarantee: str = "at_least_once",
        spark_conf: dict | None = None, py_files=(), executor_timeout_s: float = EXECUTOR_TIMEOUT_S,
        compaction: bool = True, config: StreamsConfig | None = None) -> BackfillReport:
    """Rebuild every task's stores of ``topology`` for ``application_id`` from topic history and
    hand over to the worker (see the module docstring): the changelogs, commit records and group
    offsets always; the worker's layout in ``state_dir`` when one is given. ``client_config``
    (``processor.kafka.client_config.ClientConfig``) reaches every client the driver and the
    executors open; ``consumer_config`` / ``producer_config`` are layered over its kinds.
    Internal topics are created and checked as the worker does (``replication_factor``,
    ``topic_configs`` per kind: processor/kafka/internal_topics.py). ``processing_guarantee``
    is the one of the worker that continues: the history is read at that worker's isolation level
    (``read_committed`` under ``exactly_once``, ``read_uncommitted`` otherwise; a consumer-config
    ``isolation.level`` overrides it), so the snapshot ends where that worker's view ends (below
    an open transaction under ``read_committed``) and no record the worker would not see (an
    aborted one, on a broker that hides them) gets into the stores. ``spark_conf``: Spark
    settings of the session the job creates (``--conf``); ``py_files``: more code for the
    executors (the topology's own module is shipped without it: ``backfill.code_shipping``).
    ``compaction=False`` replays every record of every source (``backfill.compaction``).
    ``config``: a ``processor.config.StreamsConfig`` instead of the settings keywords
    (``processing_guarantee``, ``on_error``, ``client_config``, ``replication_factor``,
    ``topic_configs``); either way they are validated before anything else is done."""
    from backfill import code_shipping

    # the shared settings, validated once (processor/config.py)
    settings = StreamsConfig.of(config, client_config=client_config, consumer_config=consumer_config,
                                producer_config=producer_config, processing_guarantee=processing_guarantee,
                                on_error=on_error, replication_factor=replication_factor,
                                topic_configs=topic_configs)
    on_error, replication_factor = settings.on_error, settings.replication_factor
    topic_configs = dict(settings.topic_configs)
    clients = client_settings(bootstrap_servers, settings)
    job = BackfillJob(topology, clients, application_id, state_dir, emit_outputs, archives, force, on_error,
                      compaction)
    job.check()
    to_ship = code_shipping.code_to_ship(job.topo, py_files)
    job.warn_what_a_replay_cannot_reproduce()
    try:
        job.open_session(spark, master, spark_conf)
        job.start_executors(to_ship, executor_timeout_s)
        job.create_topics(replication_factor, topic_configs)
        snap = job.take_snapshot()
        job.join_warm_up()
        report = BackfillReport(application_id, snap.sources, seconds=job.seconds)
        ctx = job.job_context(snap, report)
        spark_runs = job.process(ctx, snap, report)
        job.write_changelogs(spark_runs, report)
        job.emit_outputs_once(ctx, spark_runs, report)
        job.hand_over(spark_runs, snap, report)
    finally:
        job.close()
    fallback = report.executors_fall_back()
    if fallback:
        log.warning("backfill: executors ran the per-record path as pure Python on %d of %d task run(s) (%s): "
                    "the results are the same, only slower; the executors' environment needs this project "
                    "installed with `pip install .`, which compiles it (docs/compiled.md, \"Spark executors\")",
                    fallback, sum(report.executor_builds.values()), report.build_line())
    for line in report.lines():
        log.info("%s", line)
    return report
