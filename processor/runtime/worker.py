"""The consumer-group worker: the only place that consumes, produces and commits.

This file is the poll loop: consume a batch -> route each record to the Task of (sub-topology,
partition) -> the task's operators send outputs and internal records through the collector
(``processor/runtime/collector.py``); stores write into the task's write buffer -> every
``commit_interval_ms`` one commit unit (``processor/runtime/commit_unit.py``). Between polls it
runs the restore of newly assigned tasks in steps (``processor/runtime/task_manager.py``: which
tasks run here, assignment, restore, revocation, closing).

Internal topics (repartition, FK subscription/response) and changelog topics (one partition per
task, ``cleanup.policy=compact``) are created and checked at start-up
(``processor/kafka/internal_topics.py``), before any record could auto-create them on a broker
that does that. What a commit unit produces goes through ``processor/runtime/collector.py``.

Stop: SIGTERM/SIGINT finish the record in hand, flush deferred emissions (``Emit.every``),
commit, close stores and return.

Test hook: ``PROCESSOR_TEST_RESTORE_STEP_DELAY_MS=D`` sleeps D ms after each restore step (a
restore longer than ``max.poll.interval.ms`` without a huge changelog).

Test hook: with ``PROCESSOR_TEST_KILL_BEFORE_COMMIT=N`` the worker SIGKILLs itself at its N-th
commit with new records, after outputs and changelog records were flushed to Kafka and before
the commit records, group offsets or local state are written (the crash window that leaves an
uncommitted changelog tail and outputs that the replay sends again).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, TopicPartition

from processor.config import StreamsConfig
from processor.engine.routing import Routing
from processor.engine.task import dlq_topic_for
from processor.errors import ConfigError
from processor.graph import AggregateAttrs, UserProcessorAttrs
from processor.kafka import clients as kafka
from processor.kafka import internal_topics, startup_checks
from processor.kafka.client_config import ClientConfig
from processor.kafka.partitioning import determine_partitioners
from processor.runtime.changelog import RestoreInterrupted
from processor.runtime.collector import KafkaCollector
from processor.runtime.commit_unit import CommitUnit
from processor.runtime.http_endpoint import WorkerHTTPEndpoint
from processor.runtime.interactive_queries import StoreQueries, StoreView
from processor.runtime.partition_group import PartitionGroup
from processor.runtime.state_lock import StateDirLock
from processor.runtime.task_manager import TaskManagement
from processor.runtime.worker_metrics import PUBLISH_INTERVAL_S, WorkerMetrics, add_counters

if TYPE_CHECKING:
    from processor.engine.task import Task
    from processor.runtime.changelog import ChangelogWriter
    from processor.runtime.task_manager import _Restoration

log = logging.getLogger("processor.worker")

_EOF = KafkaError._PARTITION_EOF


# a gap in an internal partition that persists this long and over this many fetches is accepted
GAP_ACCEPT_S = 5.0
GAP_RETRIES = 20
# a gap of at most this many offsets (transaction markers: one per producer whose transaction
# ended between two records) is accepted when this many fetches back to it return it again
MARKER_GAP = 16
SMALL_GAP_FETCHES = 2


class Worker(TaskManagement, CommitUnit):
    def __init__(self, topology, bootstrap_servers: str, application_id: str, state_dir: str | Path,
                 *, commit_interval_ms: int = 1000, on_error: str = "dlq",
                 consumer_config: dict | None = None, producer_config: dict | None = None,
                 batch_size: int = 1000, startup_timeout_s: float = 10.0,
                 processing_guarantee: str = "at_least_once", client_config: ClientConfig | None = None,
                 replication_factor: int | None = None, topic_configs: dict[str, dict] | None = None,
                 static_membership: bool = False, http_port: int | None = None, http_host: str = "0.0.0.0",
                 health_timeout_s: float = 60.0, coalesce_fk_records: bool = True,
                 max_task_idle_ms: int = 0, config: StreamsConfig | None = None):
        # the shared settings, validated once (processor/config.py); ``config=`` or the keywords
        self.config = config = StreamsConfig.of(
            config, client_config=client_config, consumer_config=consumer_config, producer_config=producer_config,
            processing_guarantee=processing_guarantee, on_error=on_error, commit_interval_ms=commit_interval_ms,
            max_task_idle_ms=max_task_idle_ms, replication_factor=replication_factor, topic_configs=topic_configs)
        self.processing_guarantee = processing_guarantee = config.processing_guarantee
        # a task with several input partitions processes them in time order
        # (processor/runtime/partition_group.py)
        self.max_task_idle_ms = config.max_task_idle_ms
        self._groups: dict[tuple[int, int], PartitionGroup] = {}
        # group.instance.id = <application id>-<worker id> (kept in the state directory), unless
        # the consumer config names one
        self.static_membership = static_membership
        # internal topics created with these (processor/kafka/internal_topics.py); None: min(3, brokers)
        self.replication_factor = config.replication_factor
        self.topic_configs = dict(config.topic_configs)
        # every client below is opened with the user's settings: common (client_config), then
        # per kind (consumer_config / producer_config layered over client_config's)
        clients = config.clients
        # serdes bound to their topics; Schema Registry serdes get the registry settings
        topology = topology.for_application(application_id, clients.registry)
        topology.check_serde_settings()
        self.topology = topology
        self.bootstrap_servers = kafka.cluster_of(bootstrap_servers, clients)   # str(): the servers
        self.application_id = application_id
        self.state_dir = Path(state_dir) / application_id
        self.commit_interval_s = config.commit_interval_ms / 1000.0
        self.on_error = config.on_error
        self.dlq_topic = dlq_topic_for(application_id)
        self.batch_size = batch_size
        self.startup_timeout_s = startup_timeout_s
        self._consumer_config = clients.for_kind("consumer")
        # for every consumer the worker opens (group, restore, end-of-partition probes)
        self.isolation_level = config.isolation_level
        self._producer_config = clients.for_kind("producer")
        # foreign-key join subscriptions and responses wait for the commit, a later one of the
        # same pair replacing an earlier (processor/engine/fk_join_coalescing.py)
        self.coalesce_fk_records = coalesce_fk_records
        # A sub-topology reading several topics replays them in another interleaving after a
        # crash; its repartition records wait for the commit (Task ``stage_internal``) unless the
        # readers never see an uncommitted record (exactly once, read_committed).
        self._stage_internal = not (processing_guarantee == "exactly_once" and self.isolation_level == "read_committed")
        from processor.engine.partitioners import INTERNAL, PARTITIONERS

        chosen = self._producer_config.get("partitioner")
        if chosen is not None and PARTITIONERS.get(chosen) is not INTERNAL:
            raise ConfigError(f"producer setting partitioner={chosen!r}: internal topics (repartition) "
                              f"are placed by murmur2 by every host (worker, driver, backfill); the "
                              f"worker's producer must use murmur2_random (the default)")
        self.tasks: dict[tuple[int, int], Task] = {}
        self._writers: dict[tuple[int, int], ChangelogWriter] = {}
        self._suspended: dict[tuple[int, int], Task] = {}   # revoked, committed, maybe coming back
        self._sub_of_topic = topology.subtopology_of_topic()
        # sub-topology -> its input topics, where it has several (their tasks buffer and order)
        self._ordered_inputs = {i: sorted(topology.source_topics(i)) for i in range(len(topology.subtopologies))
                                if len(topology.source_topics(i)) > 1}
        self._stop = threading.Event()
        self._assigned: set[tuple[str, int]] = set()
        self._at_eof: set[tuple[str, int]] = set()
        self._closing = False
        self.first_record_at: float | None = None
        self.last_record_at: float | None = None
        self.records_processed = 0
        self.restored_records = 0
        # task id -> counters of its closed instances, summed (bounded by the task ids: a long-lived
        # worker through many rebalances keeps one entry per task, not one per closing)
        self.finished_tasks_metrics: dict[str, dict[str, dict[str, int]]] = {}
        # /metrics, /healthz, /readyz, interactive queries (processor/runtime/http_endpoint.py)
        self.metrics_state = WorkerMetrics()
        self.metrics_registry = self.metrics_state.registry
        self._queries = StoreQueries(self)
        self._ever_assigned = False
        self.http_port = http_port
        self._http_host = http_host
        self._health_timeout_s = health_timeout_s
        self.http_endpoint = None
        self._fatal: BaseException | None = None
        self._group_offsets: dict[tuple[str, int], int] = {}
        self._skipped_offsets: dict[tuple[str, int], int] = {}   # at least once, see commit()
        self._wall_punctuation = any(
            (isinstance(n.attrs, AggregateAttrs) and n.attrs.emit.mode == "every" and n.attrs.emit.clock == "wall")
            or isinstance(n.attrs, UserProcessorAttrs) for n in topology.nodes)
        self.global_tables = None   # processor/runtime/global_tables.py, opened by run()
        delay = os.environ.get("PROCESSOR_TEST_RESTORE_STEP_DELAY_MS")   # test hook: a slow restore
        self._restore_step_delay_s = int(delay) / 1000 if delay else 0.0
        kill = os.environ.get("PROCESSOR_TEST_KILL_BEFORE_COMMIT")
        self._kill_at_commit = int(kill) if kill else None
        self._commits_with_records = 0
        self._sent_at_drain_check = 0
        self._internal_topics = set(topology.internal_topics())
        # Internal topics are written by this application's producers only, so their offsets are
        # contiguous except for transaction markers; when no transaction writes them (at least
        # once) or the broker writes no markers (exactly once read uncommitted: Tansu), an offset
        # after a task's position means the broker's fetch skipped records (seen on Tansu while
        # another producer's batch was being appended): read them again (``_check_gap``).
        self._gap_guard = self._internal_topics if self._stage_internal else frozenset()
        self._gaps: dict[tuple[str, int], tuple[int, int, int, float]] = {}   # (position, offset, fetches, since)
        self.fetch_gaps_refetched = 0
        self.fetch_gaps_accepted = 0
        self._processed_at_last_commit = 0
        self._table_sinks: dict[int, list[str]] = {}
        self._parts: dict[str, int] = {}
        self._initial_commit_due = False
        self._restoring: list[_Restoration] = []   # restores under way, the first one running
        # partitions just restored, for a few seconds: records below the task's position are
        # dropped (fetched before the seek to it)
        self._resumed: set[tuple[str, int]] = set()
        self._resumed_at = 0.0
        self._sink_floors_at = time.monotonic()   # commit_unit: the table sinks' floors refreshed

    # -- startup checks -----------------------------------------------------------------------
    def check_topics(self) -> dict[str, int]:
        """Refuse to start, with one clear message, on a missing topic or a partition mismatch."""
        parts = kafka.topic_partitions(self.bootstrap_servers, self.startup_timeout_s)
        topo = self.topology
        startup_checks.require_topics(
            self.bootstrap_servers, parts,
            topo.external_source_topics() + topo.sink_topics(internal=False) + topo.global_topics(),
            self.application_id, "starting")
        wanted = internal_topics.wanted_topics(topo, parts)
        internal = {t: n for t, (n, kind) in wanted.items() if kind != "changelog"}
        # existing internal topics first (one with another partition count is named as such),
        # then co-partitioning (internal sources included); only then is anything created
        internal_topics.check_existing(self.bootstrap_servers, self.application_id, wanted, parts)
        startup_checks.check_co_partitioning(self.topology, {**internal, **parts})
        created = internal_topics.create_missing(self.bootstrap_servers, wanted, parts,
                                                 self.replication_factor, self.topic_configs)
        internal_topics.warn_deleting_sources(self.bootstrap_servers, sorted(topo.reused_source_topics()))
        startup_checks.create_dead_letter_topic(self.bootstrap_servers, self.on_error, self.dlq_topic, parts,
                                                self.replication_factor)
        if created:
            parts = {**parts, **{t: wanted[t][0] for t in created}}
        # which partitioner placed each source a join depends on (docs/semantics.md "Partitioning")
        choices = determine_partitioners(self.topology, self.bootstrap_servers, parts,
                                         self._consumer_config, self.application_id)
        self.topology = self.topology.with_partitioning(choices)
        self.routing = Routing(choices, parts)
        self._parts = parts
        self._table_sinks = {sub: sorted(self.topology.table_sinks(sub))
                             for sub in range(len(self.topology.subtopologies))}
        return parts

    def _worker_id(self) -> str:
        """A stable id of this state directory (the transactional id's suffix: a restarted
        worker fences its own zombie)."""
        path = self.state_dir / "worker.id"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(uuid.uuid4().hex + "\n")
        return path.read_text().strip()

    def _drained(self) -> bool:
        """Every assigned partition is at its end, and so is every internal partition this worker
        reads after the records it wrote itself reached the broker."""
        if self._restoring:
            return False
        if any(t.holds_records for t in self.tasks.values()):
            self.commit()   # foreign-key join records held until the commit: sends them
        if self.collector.sent == self._sent_at_drain_check:
            return True
        if self.collector.transactional:
            # records in an open transaction are invisible to a read_committed probe: commit
            # them first, or an internal partition looks drained while its records are pending
            # (a commit that sends outbox records opens the next transaction with them: commit
            # that one too)
            for _ in range(3):
                before = self.collector.sent
                self.commit()
                if self.collector.sent == before:
                    break
        self.collector.flush()
        self._sent_at_drain_check = self.collector.sent
        internal = {tp: self.tasks[(self._sub_of_topic[tp[0]], tp[1])].positions.get(tp, 0)
                    for tp in self._assigned if tp[0] in self._internal_topics}
        more = kafka.partitions_with_records_from(self.bootstrap_servers, internal,
                                                  isolation_level=self.isolation_level)
        self._at_eof -= more
        return not more

    def _check_gap(self, topic: str, part: int, pos: int | None, offset: int) -> bool:
        """An internal partition's record at ``offset``, the task at ``pos``: True when the caller
        must drop it (and the rest of the partition's batch) because the worker sought back to
        read a gap again. Records found in the gap when it is read again were skipped by the
        broker's fetch (logged, ``fetch_gaps_refetched``). A gap the broker keeps returning is
        accepted (``fetch_gaps_accepted``): after ``SMALL_GAP_FETCHES`` fetches when it spans at
        most ``MARKER_GAP`` offsets (transaction markers, one per producer whose transaction
        ended there), else after ``GAP_RETRIES`` fetches over ``GAP_ACCEPT_S`` (with a warning).
        The loop never sleeps here: other partitions go on meanwhile."""
        key = (topic, part)
        g = self._gaps.get(key)
        if g is not None:
            g_pos, g_off, attempts, since = g
            if pos is None or g_pos != pos or offset < g_off:
                del self._gaps[key]
                if pos is not None and g_pos == pos and offset < g_off:
                    self.fetch_gaps_refetched += 1
                    log.warning("%s[%d]: the broker's fetch had skipped offsets %d..%d (records are there when "
                                "read again); reading them", topic, part, pos, g_off - 1)
                return False if pos is None or offset <= pos else self._check_gap(topic, part, pos, offset)
            if offset == g_off:
                now = time.monotonic()
                small = g_off - pos <= MARKER_GAP
                if (small and attempts >= SMALL_GAP_FETCHES) or (attempts >= GAP_RETRIES and now - since >= GAP_ACCEPT_S):
                    del self._gaps[key]
                    self.fetch_gaps_accepted += 1
                    if not small:
                        log.warning("%s[%d]: offsets %d..%d returned no record in %d fetches over %.1f s; going on "
                                    "at %d", topic, part, pos, g_off - 1, attempts, now - since, g_off)
                    return False
                self._gaps[key] = (pos, g_off, attempts + 1, since)
                self.consumer.seek(TopicPartition(topic, part, pos))
                return True
        if pos is None or offset <= pos:
            return False
        self._gaps[key] = (pos, offset, 1, time.monotonic())
        self.consumer.seek(TopicPartition(topic, part, pos))
        return True

    def _forget_gaps(self, partitions) -> None:
        """Revoked, lost or rebuilt partitions: their gap checks start over."""
        for tp in partitions:
            self._gaps.pop(tp, None)

    # -- time-ordered input of tasks with several partitions ------------------------------------
    def _new_group(self, key, task) -> PartitionGroup:
        """Input buffers for ``task`` (replacing those of an instance it replaced: rebuilt after
        an aborted transaction, which sought its partitions back to its positions)."""
        old = self._groups.get(key)
        if old is not None and old.paused:
            self.consumer.resume([TopicPartition(*tp) for tp in old.paused])
        group = self._groups[key] = PartitionGroup(
            task, [(t, key[1]) for t in self._ordered_inputs[key[0]]], self.max_task_idle_ms, self._at_eof)
        return group

    def _process_buffered(self) -> int:
        """Run every task with buffered input as far as Kafka Streams' rule lets it; returns the
        records processed."""
        n = 0
        now_ms = int(time.time() * 1000)
        tasks = self.tasks
        for key, group in list(self._groups.items()):
            if not group.buffered:
                continue
            if tasks.get(key) is not group.task:   # its task is gone: so are its buffers
                self._drop_groups([key])
                continue
            before = group.buffered
            resume = group.process_ready(now_ms, self._stop)
            n += before - group.buffered
            if resume:
                self.consumer.resume([TopicPartition(*tp) for tp in resume])
        return n

    def _drop_groups(self, keys) -> None:
        """Revoked, lost or closed tasks: their buffered records are dropped (never processed,
        so never committed: fetched again by whoever runs the task next)."""
        for key in keys:
            group = self._groups.pop(key, None)
            if group is not None and group.paused and not self._closing:
                try:
                    self.consumer.resume([TopicPartition(*tp) for tp in group.paused])
                except Exception:   # not assigned any more
                    pass

    # -- main loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def restore_progress(self) -> dict[str, dict]:
        """Tasks being restored: ``{task id: {"restored": n, "remaining": m | None}}`` (remaining
        is None until the task changelog has been read)."""
        return {t.task_id: {"restored": t.store_restored,
                            "remaining": None if t.to_restore is None else t.to_restore - t.store_restored}
                for r in self._restoring for t in r.targets}

    def metrics(self) -> dict:
        """Counters of every operator, summed over live and closed tasks."""
        total: dict[str, dict[str, int]] = {}
        for m in [*self.finished_tasks_metrics.values(), *(t.metrics() for t in self.tasks.values())]:
            add_counters(total, m)
        return total

    def _retire_metrics(self, task) -> None:
        """Keep a closing task's counters (summed into its id's entry)."""
        add_counters(self.finished_tasks_metrics.setdefault(task.id, {}), task.metrics())

    def ready(self) -> bool:
        """Assigned, and every task of the assignment restored and running (``/readyz``)."""
        return (self._ever_assigned and not self._restoring and self._fatal is None and not self._stop.is_set()
                and self._queries.loop_thread is not None)

    def store(self, name: str) -> StoreView:
        """Interactive queries of a key-value store (a table, an aggregate) while the worker runs,
        from any thread: ``worker.store("totals").get("alice")`` (``KeyNotHosted`` names the
        partition when another worker owns the key; ``processor/runtime/interactive_queries.py``)."""
        return StoreView(self, name)

    def run(self, until_drained: bool = False, install_signal_handlers: bool = True,
            max_seconds: float | None = None) -> None:
        """Process until stopped (signal or ``stop()``), or with ``until_drained`` until every
        assigned partition has been read to its end."""
        # First of all: one worker process per state directory (StateDirLocked, exit code 4).
        self._state_lock = StateDirLock(self.state_dir)
        self._state_lock.acquire()
        try:
            if self.http_port is not None:
                self.metrics_state.loop_beat = time.monotonic()
                self.http_endpoint = WorkerHTTPEndpoint(self, self.http_port, self._http_host,
                                                        self._health_timeout_s).start()
            self._queries.loop_thread = threading.current_thread()
            self._run_locked(until_drained, install_signal_handlers, max_seconds)
        finally:
            self._queries.loop_thread = None
            self._queries.fail_waiting()   # queries still waiting: "the worker is not running"
            if self.http_endpoint is not None:
                self.http_endpoint.stop()
            self._state_lock.release()

    def _run_locked(self, until_drained: bool, install_signal_handlers: bool,
                    max_seconds: float | None) -> None:
        self._fatal = None
        self.check_topics()
        txn_id = None
        if self.processing_guarantee == "exactly_once":
            txn_id = f"{self.application_id}-{self._worker_id()}"
        self.collector = KafkaCollector({**kafka.producer_defaults(self.bootstrap_servers),
                                         **self._producer_config}, transactional_id=txn_id,
                                        track_ends=any(self._table_sinks.values()))
        if txn_id is not None:
            try:
                self.collector.producer.init_transactions(self.startup_timeout_s * 3)
            except Exception as exc:
                raise ConfigError(f"processing_guarantee='exactly_once': the broker at "
                                  f"{self.bootstrap_servers} did not initialise transactions for "
                                  f"{txn_id!r}: {exc}") from None
            self.collector.begin()
        cconf = kafka.consumer_defaults(self.bootstrap_servers)
        cconf.update({"group.id": self.application_id, "session.timeout.ms": 10000,
                      "heartbeat.interval.ms": 1000, "isolation.level": self.isolation_level})
        cconf.update(self._consumer_config)
        if self.static_membership and "group.instance.id" not in cconf:
            cconf["group.instance.id"] = f"{self.application_id}-{self._worker_id()}"
            log.info("static member of group %s: group.instance.id=%s", self.application_id,
                     cconf["group.instance.id"])
        if self.topology.global_stores:
            # every global table to its topics' ends before this worker joins the group
            from processor.runtime.global_tables import GlobalTables

            self.global_tables = GlobalTables(self.topology, self.bootstrap_servers, self._consumer_config,
                                              self.state_dir / "global")
            self.global_tables.bootstrap()
        self.consumer = kafka.new_consumer(cconf, "the consumer group")
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            self.consumer.subscribe(sorted(self._sub_of_topic), on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_lost)
            while True:
                self._loop(until_drained, max_seconds)
                if self._fatal is not None:
                    raise self._fatal
                sent = self.collector.sent
                for task in self.tasks.values():
                    task.flush()
                self.commit()  # sends the flush's internal records (outbox) after persisting them
                # Drained, but the flush sent deferred emissions: if some went to internal
                # topics this worker reads, process them too before stopping.
                if not until_drained or self._stop.is_set() or self.collector.sent == sent:
                    break
            self.commit()  # confirms the outbox records the last commit sent
            self.collector.flush()
        finally:
            self._closing = True
            try:
                self.consumer.close()
            finally:
                try:
                    self.collector.abort()   # an unfinished transaction (after a fatal error)
                except Exception as exc:
                    log.warning("aborting the open transaction failed: %s", exc)
                self._abort_restoration()
                self._close_tasks(list(self.tasks))
                self._close_tasks(list(self._suspended), self._suspended)
                if self.global_tables is not None:
                    self.global_tables.commit()
                    self.global_tables.close()
                    self.global_tables = None
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _loop(self, until_drained: bool, max_seconds: float | None) -> None:
        consumer = self.consumer
        tasks = self.tasks
        sub_of = self._sub_of_topic
        stop = self._stop
        at_eof = self._at_eof
        resumed = self._resumed
        guarded = self._gap_guard
        gaps = self._gaps
        started = time.monotonic()
        # A commit is due commit_interval after the last one, or, once records were processed
        # since, commit_interval after the first of them: a backlog that starts after a quiet
        # spell (or the group join) is not cut after its first batch, which would send a
        # foreign-key subscription per update of a key that the rest of the unit updates again
        last_commit = started
        work_since = None
        batch = self.batch_size
        metrics = self.metrics_state
        queries = self._queries
        ordered = self._ordered_inputs
        groups = self._groups
        while not stop.is_set():
            beat = metrics.loop_beat = time.monotonic()
            if queries.pending():
                queries.serve()
            if beat - metrics.published_at >= PUBLISH_INTERVAL_S:
                metrics.publish(self, beat)
            if self._restoring:
                try:
                    self._restore_step()
                except RestoreInterrupted:
                    break
            if self._initial_commit_due:
                # tasks opened without a commit record naming their table sinks' ends: one does,
                # before they send anything (processor/runtime/sink_tails.py); before the poll, so
                # a rebuild after an aborted transaction never meets records fetched before it
                self._initial_commit_due = False
                self.commit()
            msgs = consumer.consume(batch, 0.0 if self._restoring else 0.1)
            if self._fatal is not None:
                break
            if msgs and self.first_record_at is None:
                self.first_record_at = time.monotonic()
            n = 0
            refetching = None
            for m in msgs:
                if stop.is_set():
                    break
                err = m.error()
                if err is not None:
                    if err.code() == _EOF:
                        if not (refetching and (m.topic(), m.partition()) in refetching):
                            self._at_eof.add((m.topic(), m.partition()))
                        continue
                    if err.fatal():
                        raise ConfigError(f"fatal Kafka error: {err.str()}")
                    # librdkafka recovers from the rest itself (broker down, leader moves)
                    log.warning("Kafka error (librdkafka retries): %s", err.str())
                    continue
                topic = m.topic()
                part = m.partition()
                sub = sub_of[topic]
                task = tasks.get((sub, part))
                if task is None:  # revoked while in flight: not processed, not committed
                    continue
                group = None
                if ordered and sub in ordered:   # (its next offset: after what its buffers hold)
                    group = groups.get((sub, part))
                    if group is None or group.task is not task:
                        group = self._new_group((sub, part), task)
                if resumed and (topic, part) in resumed and m.offset() < (
                        (task.positions.get((topic, part)) if group is None else group.expected((topic, part))) or 0):
                    continue   # just restored: a record below its position is already in its state
                if topic in guarded:
                    if refetching and (topic, part) in refetching:
                        continue   # fetched before the seek back to a gap
                    pos = task.positions.get((topic, part)) if group is None else group.expected((topic, part))
                    if (gaps or (pos is not None and m.offset() > pos)) and \
                            self._check_gap(topic, part, pos, m.offset()):
                        refetching = refetching or set()
                        refetching.add((topic, part))
                        at_eof.discard((topic, part))   # not at its end: the gap is read again
                        continue
                if at_eof:
                    at_eof.discard((topic, part))
                if group is not None:   # processed below, in time order
                    if group.add((topic, part), m):
                        group.paused.add((topic, part))
                        task.buffer_pauses += 1
                        consumer.pause([TopicPartition(topic, part)])
                    continue
                task.process(topic, part, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
                n += 1
            if groups:
                n += self._process_buffered()
            if n:
                self.records_processed += n
                self.last_record_at = time.monotonic()
                if work_since is None:
                    work_since = self.last_record_at
            if self.global_tables is not None:
                self.global_tables.poll()
            if self._wall_punctuation:
                now_ms = int(time.time() * 1000)
                for task in tasks.values():
                    task.punctuate_wall(now_ms)
            now = time.monotonic()
            if now - (last_commit if work_since is None else work_since) >= self.commit_interval_s:
                self.commit()
                last_commit = now
                work_since = None
            else:
                self.collector.poll()
            if until_drained and self._assigned and self._at_eof >= self._assigned and \
                    not any(g.buffered for g in groups.values()) and self._drained():
                break
            if max_seconds is not None and now - started > max_seconds:
                break
