"""The consumer-group worker: the only place that consumes, produces and commits.

This file is the poll loop (Kafka Streams' ``StreamThread``): consume a batch -> route each record
to the Task of (sub-topology, partition) (``processor/runtime/dispatch.py``) -> the task's
operators send outputs and internal records through the collector
(``processor/runtime/collector.py``); stores write into the task's write buffer -> every
``commit_interval_ms`` the task manager's commit. Between polls it serves the group
(``processor/runtime/fleet.py``: its listener hands every change of the assignment to the task
manager) and runs the restore of newly assigned tasks in steps. The task manager
(``processor/runtime/task_manager.py``: ``TaskManager``) owns the tasks: assignment, restore,
revocation, loss, commits (``processor/runtime/commit_unit.py``), closing, time-ordered input.
Internal partitions are read through the fetch-gap guard (``processor/runtime/fetch_gaps.py``).
The ``Worker`` composes these and owns the clients' lifetime; the files that serve it read it
through the protocols they declare (``FleetHost``, ``QueryHost``, ``MetricsSource``,
``EndpointHost``). Its invariant: the clients and the components are opened in ``run`` and closed
by it, whatever happens.

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
uncommitted changelog tail and outputs that the replay sends again);
``PROCESSOR_TEST_STOP_BEFORE_COMMIT=N`` SIGSTOPs it there instead (the test sends SIGCONT).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from processor.config import StreamsConfig
from processor.engine.routing import Routing
from processor.engine.task import dlq_topic_for, max_record_bytes_of
from processor.errors import ConfigError, KafkaIOError, ProcessorError
from processor.graph import AggregateAttrs, UserProcessorAttrs
from processor.kafka import clients as kafka
from processor.kafka import startup_checks
from processor.kafka.client_config import ClientConfig
from processor.kafka.partitioning import determine_partitioners
from processor.runtime import worker_identity
from processor.runtime.changelog_reader import RestoreInterrupted
from processor.runtime.collector import KafkaCollector, ProduceFailed
from processor.runtime.dispatch import MessageDispatch
from processor.runtime.fetch_gaps import FetchGaps
from processor.runtime.fleet import WorkerFleet, refuse_a_copy
from processor.runtime.http_endpoint import WorkerHTTPEndpoint, check_advertised
from processor.runtime.http_security import HTTPSecurity, default_bind_host
from processor.runtime.interactive_queries import KeyQueryMetadata, StoreQueries, StoreView
from processor.runtime.state_lock import StateDirLock
from processor.runtime.task_manager import TaskManager
from processor.runtime.worker_metrics import PUBLISH_INTERVAL_S, WorkerMetrics

if TYPE_CHECKING:
    from confluent_kafka import Consumer

    from processor.engine.task import Task
    from processor.runtime.global_tables import GlobalTables
    from processor.runtime.standby import StandbyTasks

log = logging.getLogger("processor.worker")

# the main loop runs the group's callbacks this often (the group client, waiting, has its own thread)
FLEET_POLL_S = 0.1
# a run until drained waits at most this long, once drained, for the group to hold its offsets
# (a member expelled meanwhile rejoins and restores first)
UNTIL_DRAINED_SETTLE_S = 120.0




class Worker:
    """One member of the application's consumer group (see the module docstring)."""

    consumer: Consumer            # opened by run()
    collector: KafkaCollector     # opened by run()
    routing: Routing              # decided by check_topics()
    _state_lock: StateDirLock

    def __init__(self, topology, bootstrap_servers: str, application_id: str, state_dir: str | Path,
                 *, commit_interval_ms: int = 1000, on_error: str = "dlq",
                 consumer_config: dict | None = None, producer_config: dict | None = None,
                 batch_size: int = 1000, startup_timeout_s: float = 10.0,
                 processing_guarantee: str = "at_least_once", client_config: ClientConfig | None = None,
                 replication_factor: int | None = None, topic_configs: dict[str, dict] | None = None,
                 static_membership: bool = False, http_port: int | None = None, http_host: str | None = None,
                 health_timeout_s: float = 60.0, http_security: HTTPSecurity | None = None,
                 coalesce_fk_records: bool = True,
                 max_task_idle_ms: int = 0, num_standby_replicas: int = 0, acceptable_recovery_lag: int = 10_000,
                 max_warmup_replicas: int = 2, application_server: str | None = None,
                 config: StreamsConfig | None = None):
        # the shared settings, validated once (processor/config.py); ``config=`` or the keywords
        self.config = config = StreamsConfig.of(
            config, client_config=client_config, consumer_config=consumer_config, producer_config=producer_config,
            processing_guarantee=processing_guarantee, on_error=on_error, commit_interval_ms=commit_interval_ms,
            max_task_idle_ms=max_task_idle_ms, replication_factor=replication_factor, topic_configs=topic_configs,
            num_standby_replicas=num_standby_replicas, acceptable_recovery_lag=acceptable_recovery_lag,
            max_warmup_replicas=max_warmup_replicas, application_server=application_server)
        self.processing_guarantee = processing_guarantee = config.processing_guarantee
        # a task with several input partitions processes them in time order
        # (processor/runtime/partition_group.py)
        self.max_task_idle_ms = config.max_task_idle_ms
        # group.instance.id = <application id>-<worker id> (kept in the state directory), unless
        # the consumer config names one
        self.static_membership = static_membership
        # the fleet (processor/runtime/fleet.py, docs/fleet.md): this worker's address for the
        # others, and every member's address with its tasks as the group's last assignment gave it
        # (replaced whole: any thread may read it)
        self.application_server = config.application_server
        self.fleet_map: dict[str, dict[str, list[tuple[int, int]]]] = {}
        self.fleet: WorkerFleet | None = None   # opened by run()
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
        self.consumer_config = clients.for_kind("consumer")
        # for every consumer the worker opens (group, restore, end-of-partition probes)
        self.isolation_level = config.isolation_level
        if processing_guarantee == "exactly_once" and self.isolation_level == "read_uncommitted":
            log.warning("exactly_once with isolation.level=read_uncommitted: only for a broker whose "
                        "read_committed hides no aborted record anyway (Tansu); on one that hides them "
                        "(Apache Kafka) a task rebuilt after an aborted transaction, or moved, restores that "
                        "transaction's changelog records and commit record, and keeps state whose outputs "
                        "were aborted (docs/semantics.md \"Isolation level\")")
        self._producer_config = clients.for_kind("producer")
        if processing_guarantee == "exactly_once":
            # Kafka Streams' transaction timeout unless given (StreamsConfig.transaction_timeout_ms)
            self._producer_config = {**self._producer_config, "transaction.timeout.ms": config.transaction_timeout_ms}
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
        self.stopping = threading.Event()
        self.first_record_at: float | None = None
        self.last_record_at: float | None = None
        # /metrics, /healthz, /readyz, interactive queries (processor/runtime/http_endpoint.py)
        self.metrics_state = WorkerMetrics()
        self.metrics_registry = self.metrics_state.registry
        self.queries = StoreQueries(self)
        self.http_port = http_port
        # None: 127.0.0.1, or 0.0.0.0 for an application server other machines reach
        # (processor/runtime/http_security.py: TLS, credentials, the bind address)
        self._http_host = http_host
        self._http_security = http_security
        self._health_timeout_s = health_timeout_s
        self.http_endpoint: WorkerHTTPEndpoint | None = None
        self._fatal: BaseException | None = None
        self._dead_letter_max_bytes: int | None = None   # the dead-letter topic's own limit (check_topics)
        self._wall_punctuation = any(
            (isinstance(n.attrs, AggregateAttrs) and n.attrs.emit.mode == "every" and n.attrs.emit.clock == "wall")
            or isinstance(n.attrs, UserProcessorAttrs) for n in topology.nodes)
        # processor/runtime/global_tables.py, opened by run()
        self.global_tables: GlobalTables | None = None
        delay = os.environ.get("PROCESSOR_TEST_RESTORE_STEP_DELAY_MS")   # test hook: a slow restore
        kill = os.environ.get("PROCESSOR_TEST_KILL_BEFORE_COMMIT")
        freeze = os.environ.get("PROCESSOR_TEST_STOP_BEFORE_COMMIT")
        self._sent_at_drain_check = 0
        self.internal_topics = set(topology.internal_topics())
        # Internal topics are written by this application's producers only, so their offsets are
        # contiguous except for transaction markers; when no transaction writes them (at least
        # once) or the broker writes no markers (exactly once read uncommitted: Tansu), an offset
        # after a task's position means the broker's fetch skipped records (seen on Tansu while
        # another producer's batch was being appended): read them again (``FetchGaps``).
        self.fetch_gaps = FetchGaps(self.internal_topics if self._stage_internal else frozenset())
        self._table_sinks: dict[int, list[str]] = {}
        self.partition_counts: dict[str, int] = {}
        self.task_manager = TaskManager(
            topology, application_id=application_id, bootstrap_servers=self.bootstrap_servers,
            state_dir=self.state_dir, isolation_level=self.isolation_level, on_error=self.on_error,
            dlq_topic=self.dlq_topic, producer_config=self._producer_config, stage_internal=self._stage_internal,
            coalesce_fk_records=coalesce_fk_records, max_task_idle_ms=self.max_task_idle_ms, stop=self.stopping,
            fetch_gaps=self.fetch_gaps, metrics=self.metrics_state,
            restore_step_delay_s=int(delay) / 1000 if delay else 0.0,
            kill_at_commit=int(kill) if kill else None, stop_at_commit=int(freeze) if freeze else None)

    # -- the components' state, as the worker's (tests, metrics, interactive queries) -----------
    @property
    def tasks(self) -> dict[tuple[int, int], Task]:
        """The open tasks by (sub-topology, partition)."""
        return self.task_manager.tasks

    @property
    def standby_tasks(self) -> StandbyTasks | None:
        """This worker's standby replicas (while it runs)."""
        return None if self.fleet is None else self.fleet.standby

    @property
    def records_processed(self) -> int:
        """Input records processed by this worker's tasks."""
        return self.task_manager.records_processed

    @property
    def restored_records(self) -> int:
        """Changelog records restored into the tasks' stores."""
        return self.task_manager.restored_records

    @property
    def finished_tasks_metrics(self) -> dict[str, dict[str, dict[str, int]]]:
        """Task id -> counters of its closed instances, summed."""
        return self.task_manager.finished_tasks_metrics

    @property
    def fetch_gaps_refetched(self) -> int:
        """Gaps of internal partitions whose records were there when read again."""
        return self.fetch_gaps.refetched

    @property
    def fetch_gaps_accepted(self) -> int:
        """Gaps of internal partitions accepted after the broker kept returning them."""
        return self.fetch_gaps.accepted

    # -- startup checks -----------------------------------------------------------------------
    def check_topics(self) -> dict[str, int]:
        """Refuse to start, with one clear message, on a missing topic or a partition mismatch."""
        # (processor/kafka/startup_checks.py: the start-up routine of the worker and the backfill)
        topo = self.topology
        plan = startup_checks.check_topics(self.bootstrap_servers, topo, self.application_id, "starting",
                                           timeout_s=self.startup_timeout_s)
        parts = startup_checks.create_topics(self.bootstrap_servers, topo, plan,
                                             replication_factor=self.replication_factor,
                                             topic_configs=self.topic_configs, on_error=self.on_error,
                                             dead_letter_topic=self.dlq_topic)
        self._dead_letter_max_bytes = None if self.on_error != "dlq" else startup_checks.dead_letter_record_limit(
            self.bootstrap_servers, self.dlq_topic, max_record_bytes_of(self._producer_config))
        # which partitioner placed each source a join depends on (docs/semantics.md "Partitioning")
        choices = determine_partitioners(self.topology, self.bootstrap_servers, parts,
                                         self.consumer_config, self.application_id)
        self.topology = self.topology.with_partitioning(choices)
        self.routing = Routing(choices, parts)
        self.partition_counts = parts
        self._table_sinks = {sub: sorted(self.topology.table_sinks(sub))
                             for sub in range(len(self.topology.subtopologies))}
        return parts

    @property
    def worker_id(self) -> str:
        """A stable id of this state directory (the transactional id's suffix: a restarted
        worker fences its own zombie)."""
        return worker_identity.worker_id(self.state_dir)

    def _drained(self) -> bool:
        """Every assigned partition is at its end, and so is every internal partition this worker
        reads after the records it wrote itself reached the broker."""
        tm = self.task_manager
        if tm.restoring:
            return False
        if any(t.holds_records for t in tm.tasks.values()):
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
        internal = {tp: tm.tasks[(self.task_manager.sub_of_topic[tp[0]], tp[1])].positions.get(tp, 0)
                    for tp in tm.assigned if tp[0] in self.internal_topics}
        more = kafka.partitions_with_records_from(self.bootstrap_servers, internal,
                                                  isolation_level=self.isolation_level)
        tm.at_eof -= more
        return not more

    def commit(self) -> None:
        """One commit unit for every task that has work (``Committer.commit``). Never after a
        fatal error."""
        if self._fatal is not None:
            return
        self.task_manager.commit()

    # -- main loop ----------------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping.set()

    def fail(self, exc: BaseException) -> None:
        """Stop on ``exc`` (the first one is raised by ``run``): an error where nothing can raise
        into the main loop (the group's callbacks)."""
        self._fatal = self._fatal or exc
        self.stopping.set()

    @property
    def failed(self) -> bool:
        """Whether the worker stops on an error."""
        return self._fatal is not None

    def restore_progress(self) -> dict[str, dict]:
        """Tasks being restored: ``{task id: {"restored": n, "remaining": m | None}}`` (remaining
        is None until the task changelog has been read)."""
        return {t.task_id: {"restored": t.store_restored,
                            "remaining": None if t.to_restore is None else t.to_restore - t.store_restored}
                for r in self.task_manager.restoring for t in r.targets}

    def metrics(self) -> dict[str, dict[str, int]]:
        """Counters of every operator, summed over live and closed tasks."""
        return self.task_manager.metrics()

    def ready(self) -> bool:
        """Assigned, and every task of the assignment restored and running (``/readyz``)."""
        tm = self.task_manager
        return (tm.ever_assigned and not tm.restoring and self._fatal is None and not self.stopping.is_set()
                and self.queries.loop_thread is not None)

    def store(self, name: str) -> StoreView:
        """Interactive queries of a key-value store (a table, an aggregate) while the worker runs,
        from any thread: ``worker.store("totals").get("alice")`` (``KeyNotHosted`` names the
        partition when another worker owns the key; ``processor/runtime/interactive_queries.py``)."""
        return StoreView(self, name)

    def metadata_for_key(self, store: str, key) -> KeyQueryMetadata:
        """Which worker runs ``key``'s task of ``store`` as active, which keep standbys, its
        partition and task (Kafka Streams' ``queryMetadataForKey``), from any thread while the
        worker runs. Python reads never forward: query the worker this names."""
        return StoreView(self, store).metadata(key)

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
                host = self._http_host or default_bind_host(self.application_server)
                self.http_endpoint = WorkerHTTPEndpoint(self, self.http_port, host, self._health_timeout_s,
                                                        self._http_security).start()
            # does --application-server reach this endpoint? one line if not (the worker runs on)
            check_advertised(self.application_server, self.http_endpoint)
            self.queries.loop_thread = threading.current_thread()
            self._run_locked(until_drained, install_signal_handlers, max_seconds)
        finally:
            self.queries.loop_thread = None
            self.queries.fail_waiting()   # queries still waiting: "the worker is not running"
            if self.http_endpoint is not None:
                self.http_endpoint.stop()
            self._state_lock.release()

    def _run_locked(self, until_drained: bool, install_signal_handlers: bool,
                    max_seconds: float | None) -> None:
        self._fatal = None
        self.check_topics()
        # a copied state directory is refused before its transactional id could fence the original
        refuse_a_copy(self, int(self.consumer_config.get("session.timeout.ms", 10_000)) / 1000)
        txn_id = None
        if self.processing_guarantee == "exactly_once":
            txn_id = f"{self.application_id}-{self.worker_id}"
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
        cconf.update(self.consumer_config)
        if self.topology.global_stores:
            # every global table to its topics' ends before this worker joins the group
            from processor.runtime.global_tables import GlobalTables

            self.global_tables = GlobalTables(self.topology, self.bootstrap_servers, self.consumer_config,
                                              self.state_dir / "global")
            self.global_tables.bootstrap()
        # the data consumer reads what the group assigns (assign() only: the group protocol runs in
        # WorkerFleet's membership client); its group.id is the application's (committed offsets)
        self.consumer = kafka.new_consumer(cconf, "the consumer group")
        self.fetch_gaps.consumer = self.consumer
        self.task_manager.open(self.topology, routing=self.routing, parts=self.partition_counts,
                               table_sinks=self._table_sinks, consumer=self.consumer, collector=self.collector,
                               global_tables=self.global_tables, dead_letter_max_bytes=self._dead_letter_max_bytes)
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stopping.set())
        try:
            self.fleet = WorkerFleet(self)
            self.task_manager.committer.group = self.fleet
            run_started, unsettled_since = time.monotonic(), 0.0
            while True:
                self._loop(until_drained, max_seconds)
                if self._fatal is not None:
                    raise self._fatal
                sent = self.collector.sent
                for task in self.tasks.values():
                    task.flush()
                self.commit()  # sends the flush's internal records (outbox) after persisting them
                if not until_drained or self.stopping.is_set():
                    break
                # Drained, but the flush sent deferred emissions: if some went to internal
                # topics this worker reads, process them too before stopping. And drained means
                # committed: until the group holds the offsets (a member expelled meanwhile
                # rejoins, and commits the positions its tasks restore), the loop goes on.
                if self.collector.sent != sent:
                    unsettled_since = 0.0
                else:
                    unsettled = self.task_manager.committer.unsettled()
                    if unsettled is None:
                        break
                    if max_seconds is not None and time.monotonic() - run_started > max_seconds:
                        log.warning("stopped after max_seconds=%s with the group not holding this worker's "
                                    "offsets: %s", max_seconds, unsettled)
                        break
                    unsettled_since = unsettled_since or time.monotonic()
                    if time.monotonic() - unsettled_since > UNTIL_DRAINED_SETTLE_S:
                        raise KafkaIOError(f"drained, but the group {self.application_id!r} did not hold this "
                                           f"worker's offsets after {UNTIL_DRAINED_SETTLE_S:.0f} s: {unsettled}")
            self.commit()  # confirms the outbox records the last commit sent
            self.collector.flush()
        finally:
            self.task_manager.closing = True
            try:
                if self.fleet is not None:
                    self.fleet.close()   # leaves the group: what this worker owns is revoked first
            except Exception as exc:
                log.warning("leaving the group failed (the group notices after the session timeout): %s", exc)
            try:
                self.consumer.close()
            finally:
                try:
                    self.collector.abort()   # an unfinished transaction (after a fatal error)
                except Exception as exc:
                    log.warning("aborting the open transaction failed: %s", exc)
                self.task_manager.close_all()
                if self.global_tables is not None:
                    self.global_tables.commit()
                    self.global_tables.close()
                    self.global_tables = self.task_manager.global_tables = None
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _loop(self, until_drained: bool, max_seconds: float | None) -> None:
        consumer = self.consumer
        tm = self.task_manager
        tasks = tm.tasks
        stop = self.stopping
        at_eof = tm.at_eof
        restoring = tm.restoring
        assigned = tm.assigned
        started = time.monotonic()
        # A commit is due commit_interval after the last one, or, once records were processed
        # since, commit_interval after the first of them: a backlog that starts after a quiet
        # spell (or the group join) is not cut after its first batch, which would send a
        # foreign-key subscription per update of a key that the rest of the unit updates again
        last_commit = started
        work_since = None
        batch = self.batch_size
        metrics = self.metrics_state
        queries = self.queries
        groups = tm.groups
        dispatch = MessageDispatch(consumer, tm, self.fetch_gaps, stop).dispatch
        fleet = self.fleet
        assert fleet is not None
        fleet_polled = 0.0
        while not stop.is_set():
            beat = metrics.loop_beat = time.monotonic()
            if beat - fleet_polled >= FLEET_POLL_S:
                fleet_polled = beat
                fleet.serve()   # the group's callbacks run here, between two batches
                if self._fatal is not None:
                    break
            if not restoring:
                fleet.step()
            if queries.pending():
                queries.serve()
            if beat - metrics.published_at >= PUBLISH_INTERVAL_S:
                metrics.publish(self, beat)
            if restoring:
                try:
                    tm.restore_step()
                except RestoreInterrupted:
                    break
            if tm.initial_commit_due:
                # tasks opened without a commit record naming their table sinks' ends: one does,
                # before they send anything (processor/runtime/sink_tails.py); before the poll, so
                # a rebuild after an aborted transaction never meets records fetched before it
                tm.initial_commit_due = False
                self.commit()
            # (librdkafka's messages: one without an error has a topic, partition and offset;
            # the client's stubs declare them optional)
            # (no wait while queries wait: a scan is answered in slices, one per iteration)
            msgs: list[Any] = consumer.consume(batch, 0.0 if restoring or queries.pending() else 0.1)
            if self._fatal is not None:
                break
            if msgs and self.first_record_at is None:
                self.first_record_at = time.monotonic()
            try:
                n = dispatch(msgs) if msgs else 0
                if groups:
                    n += tm.process_buffered()
            except ProduceFailed as exc:
                # exactly once: a producer whose transaction failed (its records timed out while
                # the broker was paused) refuses records: the batch is dropped with the transaction,
                # the tasks are rebuilt from their changelogs and sought back to their positions
                if not self.collector.transactional:
                    raise
                self.task_manager.committer.transaction_failed(exc)
                n = 0
            except ProcessorError as exc:
                if exc.undone_record is None:
                    raise
                # an error not of the record's making (a registry outage past its bound) met a record
                # that left nothing behind: what came before it is committed, so a restart neither
                # redoes it (outputs, dead letters) nor skips the record, then the worker stops
                log.info("stopping: committing what was processed before %s[%d]@%d first", *exc.undone_record)
                try:
                    self.commit()
                except Exception as commit_exc:   # (under exactly once, the wait may have outlived the
                    # transaction: it is aborted, and a restart processes its records again)
                    log.warning("could not commit before stopping (%s: %s): what was processed since the last "
                                "commit is processed again after a restart", type(commit_exc).__name__, commit_exc)
                raise
            if n:
                tm.records_processed += n
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
            if until_drained and assigned and at_eof >= assigned and \
                    not any(g.buffered for g in groups.values()) and self._drained():
                break
            if max_seconds is not None and now - started > max_seconds:
                break
