"""The worker's Prometheus metrics (``Worker.metrics_registry``; served at ``/metrics`` by
``processor/runtime/http_endpoint.py``, or by any exporter a user embeds the worker in).

Invariant: nothing here touches a task, a store or a Kafka client from a scraping thread. The
main loop publishes a snapshot (``publish``) about once a second; a scrape turns the last
snapshot into metric families, plus the ages it computes from two timestamps (the main loop's
last iteration, the last commit) and the process metrics of ``prometheus_client``. Counters
are monotonic per label set: a task's counters are its closed instances' plus its live one's.

Metric names (docs/operations.md "Metrics, health probes and interactive queries"):

- ``processor_records_processed_total``: input records processed by this worker.
- ``processor_task_events_total{task, operator, event}``: every counter of every operator of
  every task (``records_in``, ``noop_updates_skipped``, ``emissions_deferred``,
  ``late_records_dropped``, ``stale_responses_dropped``, ...) and the task's own (operator
  ``task``: ``processed``, ``dead_lettered`` (``dead_lettered_cut``: of them, sent as stubs),
  ``skipped_poison``, ``duplicates_dropped``).
- ``processor_tasks_rebuilt_total``: exactly once, tasks closed without their uncommitted state
  and rebuilt from their changelogs after an aborted transaction (a healthy worker's cooperative
  rebalance rebuilds none).
- ``processor_fetch_gaps_refetched_total``, ``processor_fetch_gaps_accepted_total``: internal-topic
  offsets a fetch skipped and the worker read again, and gaps accepted as transaction markers.
- ``processor_consumer_lag_records{topic, partition}``: the fetch high watermark minus the
  task's position, per assigned input partition.
- ``processor_restore_remaining_records{task}``, ``processor_restore_restored_records{task}``
  and ``processor_restore_rate_records_per_second``: the restore under way (none: no series).
- ``processor_registry_retries_total{kind}``: Schema Registry calls that failed because the
  registry could not be used and were tried again (``unreachable``, ``timeout``,
  ``unavailable``, ``throttled``, ``unauthorized``; ``processor/serde/registry.py``): read live,
  while the main loop waits an outage out.
- ``processor_commit_latency_seconds`` (histogram): one commit unit, flush to local batch.
- ``processor_last_commit_age_seconds``, ``processor_main_loop_age_seconds``.
- ``processor_assigned_tasks``, ``processor_restoring_tasks``, ``processor_ready`` (0/1).
- ``process_*`` (CPU, resident memory, open files) and ``python_info``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from processor.engine.task_id import TaskId

if TYPE_CHECKING:
    from processor.engine.task import Task
    from processor.runtime.standby import StandbyTasks

# the main loop publishes a snapshot this often
PUBLISH_INTERVAL_S = 1.0
_COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class TaskManagerState(Protocol):
    """What the metrics read of the worker's task manager (``processor/runtime/task_manager.py``)."""

    assigned: set[tuple[str, int]]
    sub_of_topic: dict[str, int]
    restoring: list          # its restorations (``Restoration``: ``started``)
    tasks_rebuilt: int


class MetricsSource(Protocol):
    """What the metrics read of a running worker (``processor/runtime/worker.py``), on its main
    loop."""

    @property
    def task_manager(self) -> TaskManagerState: ...

    @property
    def tasks(self) -> dict[tuple[int, int], Task]: ...

    @property
    def standby_tasks(self) -> StandbyTasks | None: ...

    @property
    def records_processed(self) -> int: ...

    @property
    def finished_tasks_metrics(self) -> dict[str, dict[str, dict[str, int]]]: ...

    @property
    def fetch_gaps_refetched(self) -> int: ...

    @property
    def fetch_gaps_accepted(self) -> int: ...

    def ready(self) -> bool: ...

    def restore_progress(self) -> dict[str, dict]: ...


def add_counters(total: dict[str, dict[str, int]], metrics: dict[str, dict[str, int]]) -> None:
    """Add a task's ``{operator: {counter: n}}`` into ``total``."""
    for node, counters in metrics.items():
        agg = total.setdefault(node, {})
        for k, v in counters.items():
            agg[k] = agg.get(k, 0) + v


class WorkerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.commit_latency = Histogram("processor_commit_latency_seconds",
                                        "Duration of one commit unit (changelog writes, flush, commit "
                                        "records, offsets or transaction, local batch)",
                                        buckets=_COMMIT_BUCKETS, registry=self.registry)
        self.registry.register(_SnapshotCollector(self))
        self.snapshot: dict | None = None
        self.published_at = 0.0
        self.loop_beat = time.monotonic()       # the main loop's last iteration
        self.last_commit_at: float | None = None

    def observe_commit(self, started: float) -> None:
        now = time.monotonic()
        self.commit_latency.observe(now - started)
        self.last_commit_at = now

    def publish(self, worker: MetricsSource, now: float) -> None:
        """Main loop only: a snapshot of what a scrape reports."""
        self.published_at = now
        tasks: dict[str, dict[str, dict[str, int]]] = {}
        for task_id, m in [*worker.finished_tasks_metrics.items(),
                           *((t.id, t.metrics()) for t in worker.tasks.values())]:
            add_counters(tasks.setdefault(task_id, {}), m)
        lag = {}
        consumer = getattr(worker, "consumer", None)
        if consumer is not None:
            from confluent_kafka import TopicPartition

            for topic, part in sorted(worker.task_manager.assigned):
                task = worker.tasks.get((worker.task_manager.sub_of_topic[topic], part))
                if task is None:
                    continue
                try:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
                except Exception:
                    continue
                if high is not None and high >= 0:
                    lag[(topic, part)] = max(0, high - task.positions.get((topic, part), 0))
        restore = worker.restore_progress()
        restored = sum(p["restored"] for p in restore.values())
        started = min((r.started for r in worker.task_manager.restoring), default=None)
        self.snapshot = {
            "records_processed": worker.records_processed,
            "tasks_rebuilt": worker.task_manager.tasks_rebuilt,
            "gaps": (worker.fetch_gaps_refetched, worker.fetch_gaps_accepted),
            "tasks": tasks,
            "lag": lag,
            "restore": restore,
            "restore_rate": restored / max(now - started, 1e-3) if started is not None else 0.0,
            "assigned": len(worker.tasks),
            "ready": worker.ready(),
            "standby": {str(TaskId(*k)): lag for k, lag in sorted(standby.lags().items())}
            if (standby := worker.standby_tasks) is not None else {},
            "standby_tasks": 0 if standby is None else len(standby.dbs),
        }


class _SnapshotCollector:
    def __init__(self, metrics: WorkerMetrics):
        self._m = metrics

    def collect(self):
        m = self._m
        now = time.monotonic()
        loop_age = GaugeMetricFamily("processor_main_loop_age_seconds",
                                     "Seconds since the main loop's last iteration (/healthz)")
        loop_age.add_metric([], now - m.loop_beat)
        yield loop_age
        commit_age = GaugeMetricFamily("processor_last_commit_age_seconds",
                                       "Seconds since the last commit unit (none yet: no sample)")
        if m.last_commit_at is not None:
            commit_age.add_metric([], now - m.last_commit_at)
        yield commit_age
        from processor.serde.registry import retry_counts

        registry_retries = CounterMetricFamily("processor_registry_retries",
                                               "Schema Registry calls retried because the registry could not "
                                               "be used, per kind of failure", labels=["kind"])
        for kind, v in retry_counts().items():
            registry_retries.add_metric([kind], v)
        yield registry_retries
        s = m.snapshot
        if s is None:
            return
        processed = CounterMetricFamily("processor_records_processed",
                                        "Input records processed by this worker")
        processed.add_metric([], s["records_processed"])
        yield processed
        rebuilt = CounterMetricFamily("processor_tasks_rebuilt",
                                      "Exactly once: tasks rebuilt from their changelogs after an aborted transaction")
        rebuilt.add_metric([], s["tasks_rebuilt"])
        yield rebuilt
        for name, what, v in (("processor_fetch_gaps_refetched", "Internal-topic offsets skipped by a fetch and read "
                               "again (processor/runtime/fetch_gaps.py)", s["gaps"][0]),
                              ("processor_fetch_gaps_accepted", "Internal-topic gaps that held no readable record "
                               "(transaction markers)", s["gaps"][1])):
            c = CounterMetricFamily(name, what)
            c.add_metric([], v)
            yield c
        events = CounterMetricFamily("processor_task_events",
                                     "Counters of every operator of every task (operator 'task': the task's own)",
                                     labels=["task", "operator", "event"])
        for task_id, per in sorted(s["tasks"].items()):
            for node, counters in sorted(per.items()):
                for event, v in sorted(counters.items()):
                    events.add_metric([task_id, node, event], v)
        yield events
        lag = GaugeMetricFamily("processor_consumer_lag_records",
                                "Fetch high watermark minus the task's position", labels=["topic", "partition"])
        for (topic, part), v in sorted(s["lag"].items()):
            lag.add_metric([topic, str(part)], v)
        yield lag
        remaining = GaugeMetricFamily("processor_restore_remaining_records",
                                      "Changelog records left to restore, per task being restored", labels=["task"])
        restored = GaugeMetricFamily("processor_restore_restored_records",
                                     "Changelog records restored so far, per task being restored", labels=["task"])
        for task_id, p in sorted(s["restore"].items()):
            restored.add_metric([task_id], p["restored"])
            if p["remaining"] is not None:
                remaining.add_metric([task_id], p["remaining"])
        yield remaining
        yield restored
        rate = GaugeMetricFamily("processor_restore_rate_records_per_second",
                                 "Records restored per second by the restore under way (0: none)")
        rate.add_metric([], s["restore_rate"])
        yield rate
        assigned = GaugeMetricFamily("processor_assigned_tasks", "Tasks open (restored and running)")
        assigned.add_metric([], s["assigned"])
        yield assigned
        restoring = GaugeMetricFamily("processor_restoring_tasks", "Tasks being restored")
        restoring.add_metric([], len(s["restore"]))
        yield restoring
        ready = GaugeMetricFamily("processor_ready", "1 when /readyz answers 200")
        ready.add_metric([], 1 if s["ready"] else 0)
        yield ready
        standbys = GaugeMetricFamily("processor_standby_tasks", "Standby replicas (warm-ups included) kept here")
        standbys.add_metric([], s["standby_tasks"])
        yield standbys
        standby_lag = GaugeMetricFamily("processor_standby_lag_records",
                                        "Changelog records a standby replica is behind (0 once its pass caught up)",
                                        labels=["task"])
        for task_id, v in s["standby"].items():
            standby_lag.add_metric([task_id], v)
        yield standby_lag
