"""The worker's side of the fleet: its group membership, its standby replicas and its report.

``WorkerFleet`` joins the application's group through ``FleetMembership``
(``processor/runtime/membership.py``) and turns what the group decides into the worker's work:
partitions revoked, assigned or lost go to the worker's ``TaskManager`` (``handle_revocation``,
``handle_assignment``, ``handle_lost``); the
standby replicas and warm-ups the assignment names are kept by ``StandbyTasks``
(``processor/runtime/standby.py``), stepped between batches; the fleet's map (every worker's
application server with its tasks) is ``worker.fleet_map``.

Invariants:

1. **A task's database is open once.** A task becoming active here stops being a standby first
   (``StandbyTasks.release``), and a standby is opened only for a task not active here.
2. **The report is a snapshot.** What this member tells the leader (its application server, the
   tasks it runs, the changelog offset sum of every task it holds state of: running, kept as a
   standby, or closed here and left on disk, a revoked task or a dropped standby alike) is rebuilt
   by the main loop (``refresh_report``) and only read by the group client, which may build a
   join on its own thread.
3. **Warm-ups end in a probing rebalance.** A member given warm-ups asks for a rebalance once
   their copies have caught up (a completed standby pass), at most every ``PROBING_INTERVAL_S``,
   so a task waiting on a warm-up moves without an operator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from processor.engine.task_id import TaskId
from processor.errors import CopiedStateDir
from processor.runtime.changelog_reader import RestoreInterrupted
from processor.runtime.fleet_assignor import FleetRules
from processor.runtime.fleet_codecs import Assignment, Subscription
from processor.runtime.membership import FleetListener, FleetMembership, live_claims
from processor.runtime.membership_settings import kafka_python_settings
from processor.runtime.standby import StandbyTasks
from processor.runtime.worker_identity import copied_state_dir_message, is_gone, on_this_host, process_instance

if TYPE_CHECKING:
    from processor.config import StreamsConfig
    from processor.kafka.clients import KafkaCluster
    from processor.runtime.task_manager import TaskManager
    from processor.runtime.worker_metrics import WorkerMetrics
    from processor.topology.core import Topology

log = logging.getLogger("processor.fleet")

TaskKey = tuple[int, int]
# the least time between two probing rebalances asked by this member
PROBING_INTERVAL_S = 10.0
# a standby pass's share of the main loop: this long between two polls of the data consumer
STANDBY_STEP_S = 0.05
# how long a worker waits at start-up to see whether a member of another host claiming its worker id
# is live (at most a session timeout; kept below the health probe's default timeout)
COPY_CHECK_WAIT_S = 20.0
# how long past a session timeout a member the leader refuses as a copy waits before it stops
REFUSAL_GRACE_S = 5.0


class FleetHost(Protocol):
    """What the fleet reads of its worker (``processor/runtime/worker.py``): its settings and
    identity, its task manager (every change of the assignment goes there), and how to stop it.
    It writes only ``fleet_map`` (replaced whole) and the health beat of a start-up wait."""

    application_id: str
    bootstrap_servers: KafkaCluster
    config: StreamsConfig
    consumer_config: dict
    state_dir: Path
    static_membership: bool
    topology: Topology
    partition_counts: dict[str, int]
    task_manager: TaskManager
    metrics_state: WorkerMetrics
    stopping: threading.Event
    fleet_map: dict[str, dict[str, list[tuple[int, int]]]]

    @property
    def worker_id(self) -> str: ...

    @property
    def failed(self) -> bool: ...

    def fail(self, exc: BaseException) -> None: ...


def fleet_rules(worker: FleetHost) -> FleetRules:
    """Every task of the worker's topology with its source partitions (a task is a partition
    number of a sub-topology: co-partitioned inputs stay together), and which have state (stores
    of the user's: a stateless task has no standby and moves without a warm-up, as in Kafka
    Streams)."""
    topo = worker.topology
    tasks: dict[TaskKey, list[tuple[str, int]]] = {}
    stateful: set[TaskKey] = set()
    for sub in range(len(topo.subtopologies)):
        topics = sorted(topo.source_topics(sub))
        if not topics:
            continue
        for p in range(worker.partition_counts[topics[0]]):
            tasks[(sub, p)] = [(t, p) for t in topics]
            if topo.stores_of(sub):   # (every task has its ``__task`` and ``_bookkeeping``
                stateful.add((sub, p))  # stores: small, restored at once, never a reason for a standby)
    cfg = worker.config
    return FleetRules(partitions_of_task=tasks, stateful=stateful, num_standbys=cfg.num_standby_replicas,
                      acceptable_recovery_lag=cfg.acceptable_recovery_lag, max_warmups=cfg.max_warmup_replicas)


def refuse_a_copy(worker: FleetHost, session_timeout_s: float) -> None:
    """At start-up, before anything fences anything (fleet_assignor.py invariant 5): stop with one line
    (``CopiedStateDir``) when a live member of the group, another process, claims this worker's
    id. A member whose process is gone (this host, its pid not running the process that
    reported, or this very pid: a restarted container) is a dead member the group has not
    expired yet. One on another host is live if it is still there after a session timeout (at
    most ``COPY_CHECK_WAIT_S``); a static member (``--static-membership``) does not wait: a
    static member that stopped stays in the group for its session timeout, and Kafka itself
    fences one of two members with one ``group.instance.id``. A group that cannot be described
    (no such group yet, a broker that sends no member metadata: Tansu, settings kafka-python
    cannot take) passes, with one line: the leader's check at the join remains."""
    worker_id = worker.worker_id
    me, _ = process_instance()
    options, _ = kafka_python_settings(worker.consumer_config)
    bootstrap = worker.bootstrap_servers.bootstrap_servers

    def others() -> list[tuple[str, str, int | None]]:
        try:
            claims = live_claims(bootstrap, worker.application_id, worker_id, options)
        except Exception as exc:   # (the leader's check at the join remains)
            log.info("could not describe group %s to look for a live copy of this worker (%s: %s); the "
                     "group's leader checks at the join", worker.application_id, type(exc).__name__, exc)
            return []
        return [c for c in claims if c[1] != me and not is_gone(c[1])]
    found = others()
    elsewhere = [c for c in found if not on_this_host(c[1])]
    if elsewhere and worker.static_membership:
        log.warning("worker id %s is claimed by a member on another host (%s): a static member that stopped "
                    "there, or a copy of this state directory", worker_id, ", ".join(c[1] for c in elsewhere))
        found = [c for c in found if on_this_host(c[1])]
    elif elsewhere:
        wait = min(session_timeout_s, COPY_CHECK_WAIT_S)
        log.warning("worker id %s is claimed by a member on another host (%s): checking that it is live "
                    "(%.0f s)", worker_id, ", ".join(c[1] for c in elsewhere), wait)
        worker.metrics_state.loop_beat = time.monotonic()
        time.sleep(wait)
        members = {c[0] for c in found}
        found = [c for c in others() if c[0] in members]
    if found:
        _, other, since = found[0]
        raise CopiedStateDir(copied_state_dir_message(worker_id, worker.state_dir, other, since))


class WorkerFleet(FleetListener):
    """One worker's membership, standbys and report (see the module docstring)."""

    def __init__(self, worker: FleetHost) -> None:
        self.worker = worker
        self.rules = fleet_rules(worker)
        tm = worker.task_manager
        self.standby = StandbyTasks(worker.topology, worker.state_dir, tm.restore_consumer_config(), worker.stopping,
                                    reader=tm.changelog_reader)
        self.assignment: Assignment | None = None
        self.generation = -1
        self.rebalances = 0
        self._standby_due = False
        self._probe_at: float | None = None
        self._last_probe = 0.0
        self._reported_at = 0.0
        # (the task manager's state directory: the topology it names is the worker's)
        self._closed_sums: dict[TaskKey, int] = dict(
            worker.task_manager.state_directory.offset_sums(self.rules.stateful))
        instance, claimed_at = process_instance()
        self._report = Subscription(server=worker.config.application_server, process=worker.worker_id,
                                    instance=instance, claimed_at=claimed_at)
        # refused as a copy by the leader (fleet_assignor.py invariant 5): by whom, and since when
        self.claimed_by: tuple[str, int | None] | None = None
        self._refused_since: float | None = None
        self._session_timeout_s = int(worker.consumer_config.get("session.timeout.ms", 10_000)) / 1000
        self.refresh_report()
        options, unsupported = kafka_python_settings(worker.consumer_config)
        if unsupported:
            log.warning("group membership client: these consumer settings have no kafka-python equivalent "
                        "and are not applied to it (the data clients have them): %s", ", ".join(unsupported))
        session = options.pop("session_timeout_ms", 10_000)
        heartbeat = options.pop("heartbeat_interval_ms", 1_000)
        max_poll = options.pop("max_poll_interval_ms", 300_000)
        if worker.static_membership and "group_instance_id" not in options:
            options["group_instance_id"] = f"{worker.application_id}-{worker.worker_id}"
            log.info("static member of group %s: group.instance.id=%s", worker.application_id,
                     options["group_instance_id"])
        client_id = options.pop("client_id", f"{worker.application_id}-membership")
        self.membership = FleetMembership(
            worker.bootstrap_servers.bootstrap_servers, worker.application_id, sorted(worker.task_manager.sub_of_topic),
            self.rules, self.report, self, session_timeout_ms=session, heartbeat_interval_ms=heartbeat,
            max_poll_interval_ms=max_poll, client_id=client_id, client_options=options)

    # -- the report (invariant 2) ---------------------------------------------------------------
    def report(self) -> Subscription:
        return self._report

    def refresh_report(self) -> None:
        """Rebuild the report from the tasks, standbys and closed tasks' sums (main loop)."""
        tm = self.worker.task_manager
        sums = dict(self._closed_sums)
        sums.update(self.standby.offset_sums())
        running = set(tm.tasks) | {k for r in tm.restoring for k in r.keys}
        sums.update(tm.offset_sums())
        self._reported_at = time.monotonic()
        self._report = Subscription(server=self._report.server, process=self._report.process,
                                    sums={k: v for k, v in sums.items() if k in self.rules.stateful},
                                    running=sorted(running), instance=self._report.instance,
                                    claimed_at=self._report.claimed_at)

    # -- the main loop ----------------------------------------------------------------------------
    def serve(self) -> None:
        """Run the group's callbacks waiting (below), then apply a new assignment's standbys;
        the report follows the tasks (a join may be built at any time). The assignment arrives
        before its revocations and assignments are served (``on_assignment`` runs on the group
        client's thread): the standbys are applied again after each callback, so a task revoked
        here that stays here as a standby becomes one."""
        ran = self.membership.serve()
        if self.claimed_by is not None:
            self._check_refusal()
        if ran or time.monotonic() - self._reported_at >= 1.0:
            self.refresh_report()
        if self._standby_due or ran:
            self._standby_due = False
            self._apply_standbys()

    def _check_refusal(self) -> None:
        """The leader refused this member: another member reports its worker id. That member may
        be a dead process the group has not expired yet (killed and restarted within a session
        timeout: its subscription is still the group's), so this member stops only once the
        refusal has lasted past a session timeout (the group expires a dead member by then, and
        the rebalance that follows places this one), and never for a process of this host that
        is gone. Meanwhile it runs nothing: the leader gave it no task."""
        assert self.claimed_by is not None
        other, since = self.claimed_by
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
            log.warning("the group's leader refused this member: worker id %s is also reported by %s; waiting for "
                        "the group to expire it if it is a dead member (%.0f s, a session timeout)",
                        self._report.process, other, self._session_timeout_s)
        if is_gone(other):
            return
        if now - self._refused_since > self._session_timeout_s + REFUSAL_GRACE_S:
            raise CopiedStateDir(copied_state_dir_message(self._report.process, self.worker.state_dir, other, since))

    def step(self) -> None:
        """Between batches: a step of the standby pass; a probing rebalance when due."""
        if not self.standby.wanted:
            return
        try:
            caught_up = self.standby.step(STANDBY_STEP_S)
        except RestoreInterrupted:   # the worker stops: the pass ends where it is
            return
        if caught_up:
            self.refresh_report()
            a = self.assignment
            if a is not None and a.warmup and time.monotonic() - self._last_probe >= PROBING_INTERVAL_S:
                self._last_probe = time.monotonic()
                log.info("warm-up replicas %s caught up: asking the group for a probing rebalance",
                         ", ".join(str(TaskId(*k)) for k in a.warmup))
                self.membership.request_rejoin()

    def in_doubt(self) -> bool:
        return self.membership.in_doubt()

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self.membership.commit(offsets)

    def unaccepted(self, offsets: dict[tuple[str, int], int] | None = None) -> dict[tuple[str, int], int]:
        """Of ``offsets`` (default: every group offset this member sent), those the group has not
        accepted (yet)."""
        return self.membership.unaccepted(offsets)

    def group_metadata(self) -> bytes | None:
        return self.membership.group_metadata()

    def member_generation(self) -> tuple[int, str]:
        """This member's (generation, member id) now, as the group client knows it."""
        return self.membership.generation

    def _apply_standbys(self) -> None:
        a = self.assignment
        if a is None:
            return
        tm = self.worker.task_manager
        active = set(tm.tasks) | {k for r in tm.restoring for k in r.keys}
        kept = self.standby.offset_sums()
        try:   # (a standby that cannot open is set aside by update itself, the others kept)
            self.standby.update(set(a.standby) - active)
        except Exception as exc:   # the worker runs its active tasks on
            log.warning("standby replicas %s not kept: %s", sorted(a.standby), exc)
        finally:
            # a copy closed here stays on disk as far as its checkpoint reaches: it is reported
            # as such (invariant 2), or a task moving to this member the next round, its warm-up
            # closed meanwhile, would count as having no state here and be sent back
            for key, total in kept.items():
                if key not in self.standby.dbs:
                    self._closed_sums[key] = total
        self.refresh_report()

    # -- the group's callbacks (FleetListener) -------------------------------------------------------
    def on_assignment(self, assignment: Assignment, generation: int) -> None:
        # (judged on the main loop, by serve)
        self.claimed_by = assignment.claimed_by
        if assignment.claimed_by is None:
            self._refused_since = None
        self.assignment = assignment
        self.generation = generation
        self.rebalances += 1
        self.worker.fleet_map = assignment.fleet
        self._standby_due = True
        log.info("generation %d: %d active, %d standby (%d warming up)%s", generation, len(assignment.active),
                 len(assignment.standby), len(assignment.warmup), "; a probing rebalance follows"
                 if assignment.probing else "")

    def on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        self._remember_sums(partitions)
        self._handle(lambda tm: tm.handle_revocation(partitions, commit=not self.worker.failed))

    def on_assigned(self, partitions: list[tuple[str, int]], assignment: Assignment) -> None:
        tm = self.worker.task_manager
        for key in tm.keys_of(partitions):
            self.standby.release(key)   # invariant 1
        self._handle(lambda tm: tm.handle_assignment(partitions))

    def on_lost(self, partitions: list[tuple[str, int]]) -> None:
        self._remember_sums(partitions)
        self._handle(lambda tm: tm.handle_lost(partitions))

    def _handle(self, change: Callable[[TaskManager], None]) -> None:
        """A change of the assignment, by the task manager; an error stops the worker (the group
        client would only log it)."""
        try:
            change(self.worker.task_manager)
        except Exception as exc:
            # (named here too: a worker already past its last check, closing, raises it no more)
            log.error("a change of the assignment failed: %s: %s", type(exc).__name__, exc)
            self.worker.fail(exc)

    def _remember_sums(self, partitions: list[tuple[str, int]]) -> None:
        tm = self.worker.task_manager
        running = tm.offset_sums()
        for key in tm.keys_of(partitions):
            if key in running and key in self.rules.stateful:
                self._closed_sums[key] = running[key]

    def close(self) -> None:
        """Leave the group (what this worker owns is revoked first, by the task manager),
        then close the standbys."""
        try:
            self.membership.close()
        finally:
            self.standby.close()
