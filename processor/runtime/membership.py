"""Fleet membership (issue 36, step 2): the codecs and the leader's computation (pure part).

The group protocol runs through kafka-python with our assignor (protocol ``processor-fleet``);
this module holds what that assignor exchanges and computes, independent of any broker.

Invariants:

1. **Versioned user data.** Subscription and assignment user data start with a version byte
   (``1``); any other version is refused with a ``ValueError`` naming it.
2. **Lags from reported sums.** A member's lag for a task = the highest changelog offset sum any
   member reported for it (the running owner's included) minus its own (all of it when it
   reports none: a task small enough moves at once, KIP-441); ``RUNNING`` stays ``RUNNING``; a
   task nobody reports a sum for is absent (no state anywhere).
3. **Two-phase moves (KIP-429).** A task whose partitions another member reported in
   ``owned_partitions`` this round is not given to its new member in this generation: it stays
   unassigned, its owner revokes it, and the follow-up rebalance gives it over. Meanwhile, where
   its new member holds a copy of its state (a warm-up that caught up, a standby), the task is a
   standby there: the copy stays open and follows the owner's last commits, so the next round
   finds it current and moves the task, rather than finding it closed a round's processing
   behind (beyond ``acceptable_recovery_lag`` on a busy task) and sending the task back to a new
   warm-up.

4. **The protocol's partitions follow the tasks.** A member's assignment names, as Kafka
   partitions, exactly the source partitions of the active tasks it is given; standbys, warm-ups
   and the fleet's map travel only in the user data.
5. **The owner's state, on the owner's thread.** ``FleetMembership`` runs kafka-python's group
   client (a ``KafkaConsumer`` whose partitions are always paused: it never fetches) on a thread
   of its own; its rebalance callbacks are run by the owner (``serve``, the worker's main loop
   between two batches) while the group client's callback, a coroutine on its IO loop, waits
   (heartbeats go on meanwhile), so a revocation or an assignment never lands during a batch.
   Offsets committed through it carry its generation, and the group fences a stale one. (The
   group client is polled continuously: kafka-python 3.0.12 forgets a join that completed
   between two polls with a zero timeout and joins again, forever.)
6. **One process, one state directory.** Members reporting the same ``process`` (workers in
   threads of one process, sharing its state directory, as the stream threads of one Kafka
   Streams instance) are each as current as the most current of them for every task, and no
   member keeps a standby or warm-up of a task another member of its process runs or owns:
   it would be the same database (Kafka Streams places standbys per client, not per thread).

7. **One live process per worker id.** Members reporting one ``process`` (worker id) but
   different ``instance``s are live processes sharing a copied state directory: the leader keeps
   the instance that claimed the id first and gives every other one nothing but ``claimed_by``;
   the refused member stops (``CopiedStateDir``) once the refusal outlasts a session timeout
   (``WorkerFleet``: the claimant may be a dead member the group has not expired yet); the
   others are placed as if it were not there.

``FleetAssignor`` is the assignor (protocol ``processor-fleet``, cooperative, KIP-429): the
leader decodes every member's subscription, computes the lags, places the tasks
(``placement.place``), withholds what another member still owns, and answers each member with
its tasks and the fleet's map.
"""

from __future__ import annotations

import json
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer
from kafka import errors as kafka_errors
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.future import Future as KafkaFuture
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from processor.engine.task_id import TaskId
from processor.runtime.placement import RUNNING, Placement, TaskKey, place

log = logging.getLogger("processor.membership")

PROTOCOL = "processor-fleet"
TopicPart = tuple[str, int]

VERSION = 1


def _task_key(t: TaskKey) -> str:
    return str(TaskId(*t))


def _task_of(key: str) -> TaskKey:
    sub, partition = TaskId.parse(key)
    return sub, partition   # (a plain pair, as the rest of the runtime's keys)


def _check_version(data: bytes, what: str) -> bytes:
    if not data:
        raise ValueError(f"{what} user data is empty (expected version byte {VERSION})")
    if data[0] != VERSION:
        raise ValueError(f"{what} user data has version {data[0]}, this worker reads only version {VERSION}")
    return data[1:]


@dataclass
class Subscription:
    """What a member reports.

    Layout: ``[version u8 = 1][UTF-8 JSON {"server": "host:port"|null, "process": str,
    "sums": {"<sub>_<partition>": int}, "running": ["<sub>_<partition>", ...],
    "instance": str, "claimed_at": int}]``. ``process``: the worker id of its state directory;
    ``sums``: changelog offset sum of the local state per task (where known); ``running``: the
    tasks it runs as active now (their lag is ``RUNNING``); ``instance`` and ``claimed_at`` (ms):
    the live process claiming the worker id and since when (``worker_identity.py``; optional:
    absent from a worker of an older build, which then is never refused as a copy)."""

    server: str | None
    process: str
    sums: dict[TaskKey, int] = field(default_factory=dict)
    running: list[TaskKey] = field(default_factory=list)
    instance: str | None = None
    claimed_at: int | None = None


def encode_subscription(s: Subscription) -> bytes:
    body: dict[str, Any] = {"server": s.server, "process": s.process,
                            "sums": {_task_key(t): v for t, v in sorted(s.sums.items())},
                            "running": [_task_key(t) for t in sorted(s.running)]}
    if s.instance is not None:
        body["instance"], body["claimed_at"] = s.instance, s.claimed_at
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_subscription(data: bytes) -> Subscription:
    body = json.loads(_check_version(data, "subscription"))
    return Subscription(server=body["server"], process=body["process"],
                        sums={_task_of(k): int(v) for k, v in body["sums"].items()},
                        running=[_task_of(k) for k in body["running"]],
                        instance=body.get("instance"), claimed_at=body.get("claimed_at"))


def copies_of(subs: Mapping[str, Subscription]) -> dict[str, Subscription]:
    """Members refused as copies (invariant 7): member -> the subscription of the member whose
    instance keeps the worker id (the one that claimed it first; on a tie the smaller instance)."""
    first: dict[str, Subscription] = {}
    for s in subs.values():
        if s.instance is None:
            continue
        kept = first.get(s.process)
        if kept is None or (s.claimed_at or 0, s.instance) < (kept.claimed_at or 0, kept.instance or ""):
            first[s.process] = s
    return {m: first[s.process] for m, s in subs.items()
            if s.instance is not None and first[s.process].instance != s.instance}


@dataclass
class Assignment:
    """What the leader tells a member.

    Layout: ``[version u8 = 1][UTF-8 JSON {"active": [...], "standby": [...], "warmup": [...],
    "probing": bool, "fleet": {"host:port": {"active": [...], "standby": [...]}},
    "claimed_by": {"instance": str, "claimed_at": int}}]``, tasks as ``"<sub>_<partition>"``.
    ``fleet``: every member's application server with its tasks, so any worker can answer who
    holds a key's task. ``claimed_by`` (optional): this member is refused, its worker id being
    claimed by that live instance first (invariant 7); it gets no task."""

    active: list[TaskKey] = field(default_factory=list)
    standby: list[TaskKey] = field(default_factory=list)
    warmup: list[TaskKey] = field(default_factory=list)
    probing: bool = False
    fleet: dict[str, dict[str, list[TaskKey]]] = field(default_factory=dict)
    claimed_by: tuple[str, int | None] | None = None


def encode_assignment(a: Assignment) -> bytes:
    body: dict[str, Any] = {
        "active": [_task_key(t) for t in a.active], "standby": [_task_key(t) for t in a.standby],
        "warmup": [_task_key(t) for t in a.warmup], "probing": a.probing,
        "fleet": {srv: {k: [_task_key(t) for t in v] for k, v in roles.items()}
                  for srv, roles in sorted(a.fleet.items())}}
    if a.claimed_by is not None:
        body["claimed_by"] = {"instance": a.claimed_by[0], "claimed_at": a.claimed_by[1]}
    return bytes([VERSION]) + json.dumps(body, separators=(",", ":")).encode()


def decode_assignment(data: bytes) -> Assignment:
    body = json.loads(_check_version(data, "assignment"))
    claimed = body.get("claimed_by")
    return Assignment(active=[_task_of(k) for k in body["active"]],
                      standby=[_task_of(k) for k in body["standby"]],
                      warmup=[_task_of(k) for k in body["warmup"]], probing=bool(body["probing"]),
                      fleet={srv: {k: [_task_of(x) for x in v] for k, v in roles.items()}
                             for srv, roles in body["fleet"].items()},
                      claimed_by=None if claimed is None else (claimed["instance"], claimed.get("claimed_at")))


def lags_of(subs: Mapping[str, Subscription]) -> dict[str, dict[TaskKey, int]]:
    """``member -> {task: lag}`` from the reported offset sums (invariant 2)."""
    top: dict[TaskKey, int] = {}
    for s in subs.values():
        for t, v in s.sums.items():
            top[t] = max(top.get(t, v), v)
    out: dict[str, dict[TaskKey, int]] = {}
    for m, s in subs.items():
        # no state of a task: behind by all of it (a small task moves at once, as in KIP-441)
        lag = dict(top)
        lag.update({t: top[t] - v for t, v in s.sums.items()})
        for t in s.running:
            lag[t] = RUNNING
        out[m] = lag
    # members of one process share its state directory (workers in threads, as the stream threads
    # of one Kafka Streams instance): each is as current as the most current of them (invariant 6)
    by_process: dict[str, list[str]] = {}
    for m, s in subs.items():
        by_process.setdefault(s.process, []).append(m)
    for members in by_process.values():
        if len(members) < 2:
            continue
        for m in members:
            for other in members:
                if other == m:
                    continue
                for t, v in out[other].items():
                    shared = 0 if v == RUNNING else v
                    mine = out[m].get(t)
                    if mine is None or mine != RUNNING and shared < mine:
                        out[m][t] = shared
    return out


def withhold_moving(active: Mapping[str, list[TaskKey]], owned: Mapping[str, Iterable[tuple[str, int]]],
                    partitions_of_task: Mapping[TaskKey, Iterable[tuple[str, int]]]) -> dict[str, list[TaskKey]]:
    """The active tasks each member gets this generation (invariant 3): a task with a partition
    another member reported owning is withheld."""
    owner_of = {tp: m for m, tps in owned.items() for tp in tps}
    out: dict[str, list[TaskKey]] = {}
    for m, ts in active.items():
        out[m] = [t for t in ts if all(owner_of.get(tp, m) == m for tp in partitions_of_task.get(t, ()))]
    return out


def group_metadata_bytes(group: str, generation: int, member_id: str, group_instance_id: str | None = None) -> bytes:
    """librdkafka's serialized consumer group metadata (rd_kafka_consumer_group_metadata_write):
    ``b"CGMDv2:"``, native int32 generation, NUL-terminated group id, NUL-terminated member id,
    then ``0x01`` (no group instance id) or ``0x00`` and the NUL-terminated group instance id (a
    static member: Kafka checks a transactional offset commit's instance id against the group's,
    and fences a replaced one). Internal format: tests compare it with confluent-kafka's own, for
    (-1, "") and for a static member that joined a group."""
    head = b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member_id.encode() + b"\0"
    if group_instance_id is None:
        return head + b"\x01"
    return head + b"\x00" + group_instance_id.encode() + b"\0"


# -- the assignor and the membership client (kafka-python) ---------------------------------------

@dataclass
class FleetRules:
    """What the leader needs besides the members' reports: every task with its source
    partitions, which tasks have state, and the placement settings."""

    partitions_of_task: dict[TaskKey, list[TopicPart]]
    stateful: set[TaskKey]
    num_standbys: int = 0
    acceptable_recovery_lag: int = 10_000
    max_warmups: int = 2


def assign_fleet(rules: FleetRules, subs: Mapping[str, Subscription],
                 owned: Mapping[str, Iterable[TopicPart]]) -> dict[str, Assignment]:
    """The leader's whole computation (pure): member id -> its assignment (invariants 2-4, 7)."""
    refused = copies_of(subs)
    if refused:
        kept = assign_fleet(rules, {m: s for m, s in subs.items() if m not in refused},
                            {m: tps for m, tps in owned.items() if m not in refused})
        others = next(iter(kept.values())).fleet if kept else {}
        for m, first in refused.items():
            kept[m] = Assignment(fleet=others, claimed_by=(first.instance or "", first.claimed_at))
        return kept
    placement: Placement = place(sorted(rules.partitions_of_task), lags_of(subs), stateful=rules.stateful,
                                 num_standbys=rules.num_standbys,
                                 acceptable_recovery_lag=rules.acceptable_recovery_lag,
                                 max_warmups=rules.max_warmups,
                                 process={m: s.process for m, s in subs.items()})
    active = withhold_moving(placement.active, owned, rules.partitions_of_task)
    withheld = sum(len(placement.active[m]) - len(active[m]) for m in active)
    fleet: dict[str, dict[str, list[TaskKey]]] = {}
    for m, s in subs.items():
        if s.server:
            # the map names the owner the placement wants: a task withheld for one round is
            # still run by its previous owner, which answers for it until it revokes
            fleet[s.server] = {"active": sorted(placement.active.get(m, [])),
                               "standby": sorted(set(placement.standby.get(m, [])) - set(placement.warmup.get(m, [])))}
    # a task withheld for a round stays a standby where it goes, if a copy is there (invariant 3);
    # never a standby or warm-up where another member of the same process runs or owns it
    # (invariant 6: it is the same state directory)
    held_by: dict[TaskKey, set[str]] = {}
    for m, ts in placement.active.items():
        for t in ts:
            held_by.setdefault(t, set()).add(m)
    owner_of = {tp: m for m, tps in owned.items() for tp in tps}
    for t, tps in rules.partitions_of_task.items():
        held_by.setdefault(t, set()).update(owner_of[tp] for tp in tps if tp in owner_of)

    def beside_its_holder(m: str, t: TaskKey) -> bool:
        return any(h != m and h in subs and subs[h].process == subs[m].process for h in held_by.get(t, ()))

    standby = {m: sorted(t for t in set(placement.standby.get(m, []))
                         | (set(placement.active.get(m, [])) - set(active[m])) & rules.stateful & set(s.sums)
                         if not beside_its_holder(m, t))
               for m, s in subs.items()}
    warmup = {m: [t for t in placement.warmup.get(m, []) if t in standby[m]] for m in subs}
    return {m: Assignment(active=sorted(active.get(m, [])), standby=standby[m],
                          warmup=sorted(warmup[m]),
                          probing=placement.probing or withheld > 0, fleet=fleet)
            for m in subs}


class FleetListener:
    """What the worker does when its group's assignment changes (called inside
    ``FleetMembership.poll``; partitions as ``(topic, partition)``)."""

    def on_revoked(self, partitions: list[TopicPart]) -> None:
        """Partitions this member gives up: commit them, then stop running their tasks."""

    def on_assigned(self, partitions: list[TopicPart], assignment: Assignment) -> None:
        """Partitions newly given to this member (the whole assignment beside them)."""

    def on_lost(self, partitions: list[TopicPart]) -> None:
        """Partitions another member may own already: drop them without committing."""

    def on_assignment(self, assignment: Assignment, generation: int) -> None:
        """Every assignment, before the partition callbacks (standbys, warm-ups, the fleet's map
        change without any partition moving)."""


class FleetAssignor(AbstractPartitionAssignor):
    """kafka-python's assignor hook for the ``processor-fleet`` protocol (cooperative).

    ``report`` builds this member's subscription at each join; ``owned`` lists the partitions it
    runs now (KIP-429's ``owned_partitions``)."""

    name = PROTOCOL
    version = 1

    def __init__(self, rules: FleetRules, report: Callable[[], Subscription],
                 owned: Callable[[], list[TopicPart]], listener: FleetListener) -> None:
        self.rules = rules
        self.report = report
        self.owned = owned
        self.listener = listener
        self.last_assignment: Assignment | None = None
        self.leader_rounds = 0
        self._short = -1   # the fleet size last warned about (fewer workers than standbys asked)

    def supported_protocols(self) -> list[RebalanceProtocol]:
        return [RebalanceProtocol.COOPERATIVE]

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolSubscription:
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(self.owned()):
            by_topic.setdefault(t, []).append(p)
        owned = [ConsumerProtocolSubscription.TopicPartition(topic=t, partitions=ps) for t, ps in by_topic.items()]
        return ConsumerProtocolSubscription(version=1, topics=sorted(topics),
                                            user_data=encode_subscription(self.report()), owned_partitions=owned)

    def assign(self, cluster: Any, members: list[Any]) -> dict[str, ConsumerProtocolAssignment]:
        subs: dict[str, Subscription] = {}
        owned: dict[str, list[TopicPart]] = {}
        for m in members:
            subs[m.member_id] = decode_subscription(bytes(m.metadata.user_data))
            owned[m.member_id] = [(tp.topic, p) for tp in (m.metadata.owned_partitions or []) for p in tp.partitions]
        assignments = assign_fleet(self.rules, subs, owned)
        self.leader_rounds += 1
        if self.rules.stateful and self.rules.num_standbys > len(subs) - 1 and self._short != len(subs):
            self._short = len(subs)   # (one line per fleet size, not one per rebalance)
            log.warning("num_standby_replicas=%d, but the group has %d member(s): each task keeps %d standby "
                        "cop%s until more workers join", self.rules.num_standbys, len(subs), len(subs) - 1,
                        "y" if len(subs) == 2 else "ies")
        log.info("leader: placed %d tasks over %d member(s): %s", len(self.rules.partitions_of_task), len(subs),
                 "; ".join(f"{subs[m].server or m}: {len(a.active)} active, {len(a.standby)} standby"
                           f"{f' ({len(a.warmup)} warming up)' if a.warmup else ''}"
                           for m, a in sorted(assignments.items())))
        out = {}
        for m, a in assignments.items():
            by_topic: dict[str, list[int]] = {}
            for task in a.active:
                for t, p in self.rules.partitions_of_task[task]:
                    by_topic.setdefault(t, []).append(p)
            out[m] = ConsumerProtocolAssignment(version=1, assigned_partitions=sorted(
                (t, sorted(ps)) for t, ps in by_topic.items()), user_data=encode_assignment(a))
        return out

    def on_assignment(self, assignment: ConsumerProtocolAssignment, generation: int) -> None:
        a = decode_assignment(bytes(assignment.user_data))
        self.last_assignment = a
        self.listener.on_assignment(a, generation)


class _Callbacks(AsyncConsumerRebalanceListener):
    """kafka-python's rebalance listener, translated to ``FleetListener`` and handed to the
    owner's thread (``FleetMembership.serve``). The callbacks are coroutines on kafka-python's IO
    loop: while one waits for the owner, the loop runs on, heartbeats included, so a long
    revocation (a commit, a flush) or assignment never costs this member its session."""

    def __init__(self, membership: FleetMembership) -> None:
        self.m = membership

    async def on_partitions_revoked(self, revoked: Any) -> None:
        parts = sorted((tp.topic, tp.partition) for tp in revoked)
        if parts:
            await self.m.hand_over(lambda: self.m.listener.on_revoked(parts))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if assigned:
            self.m.consumer.pause(*assigned)   # this client never fetches
        parts = sorted((tp.topic, tp.partition) for tp in assigned)
        a = self.m.assignor.last_assignment
        if parts and a is not None:
            await self.m.hand_over(lambda: self.m.listener.on_assigned(parts, a))

    async def on_partitions_lost(self, lost: Any) -> None:
        parts = sorted((tp.topic, tp.partition) for tp in lost)
        if parts:
            await self.m.hand_over(lambda: self.m.listener.on_lost(parts))


class _Quiet(logging.Filter):
    """Drops kafka-python's admin client line that prints its configuration (secrets included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "with configuration" not in str(record.msg)


def live_claims(bootstrap_servers: str, group: str, process: str, client_options: Mapping[str, Any] | None = None,
                timeout_s: float = 10.0) -> list[tuple[str, str, int | None]]:
    """The ``(member_id, instance, claimed_at)`` of every member of ``group`` that reports the worker id
    ``process`` (invariant 7), as the group's coordinator describes them (kafka-python's admin
    client; the members' subscriptions are ours). A group that does not exist yet or has no
    member gives none."""
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.admin import DescribeGroupsRequest

    class Admin(KafkaAdminClient):
        # kafka-python 3.0.12 always asks for the group's authorized operations and fails to read
        # some brokers' answer (Tansu's: "15 is not a valid ACLOperation"); they are not needed
        def _describe_groups_request(self, group_ids: list[str]) -> Any:
            return DescribeGroupsRequest(groups=list(group_ids), include_authorized_operations=False)

        def _process_acl_operations(self, obj: Any) -> Any:
            return obj

    options = {k: v for k, v in (client_options or {}).items()
               if k not in ("group_instance_id", "session_timeout_ms", "heartbeat_interval_ms",
                            "max_poll_interval_ms", "request_timeout_ms")}
    budget_ms = int(timeout_s * 1000)
    quiet = _Quiet()
    admin_log = logging.getLogger("kafka.admin.client")
    admin_log.addFilter(quiet)   # it logs its configuration, passwords included, at DEBUG
    try:
        admin = Admin(bootstrap_servers=bootstrap_servers, request_timeout_ms=budget_ms,
                      bootstrap_timeout_ms=budget_ms, **options)
        try:
            described = admin.describe_groups([group])
        finally:
            admin.close()
    finally:
        admin_log.removeFilter(quiet)
    out = []
    for member in (described.get(group) or {}).get("members") or []:
        metadata = member.get("member_metadata")
        user_data = getattr(metadata, "user_data", None) if metadata is not None else None
        if isinstance(metadata, dict):
            user_data = metadata.get("user_data")
        if not user_data:
            continue
        if isinstance(user_data, str):   # (kafka-python hands the bytes over as text, one char each)
            user_data = user_data.encode("latin-1")
        try:
            sub = decode_subscription(bytes(user_data))
        except (ValueError, KeyError):   # another protocol's member, or another version's
            continue
        if sub.process == process and sub.instance is not None:
            out.append((member.get("member_id") or "", sub.instance, sub.claimed_at))
    return out


class MembershipError(Exception):
    """The group client failed (its thread stopped); the worker stops and says why."""


def group_coordinator(consumer: KafkaConsumer) -> Any:
    """kafka-python's group coordinator of ``consumer``: the one place this module reaches past
    ``KafkaConsumer``'s public API, which has no offset commit with a callback that does not wait,
    no rejoin request and no hook on when a rebalance round is driven (kafka-python is pinned to
    ``>=3.0.12,<4`` in pyproject.toml)."""
    return consumer._coordinator


def finish_pending_rebalances(coordinator: Any) -> None:
    """Have kafka-python's group coordinator drive a rebalance round while one is needed *or in
    progress*, as Java's ``AbstractCoordinator.joinGroupIfNeeded`` loops while
    ``rejoinNeededOrPending``.

    kafka-python 3.0.12 drives the JoinGroup/SyncGroup round only while ``need_rejoin()`` holds.
    A leader's rejoin that a metadata change started (its subscribed topics' metadata differs
    from the one its last assignment used: a partition added, or at start-up metadata that
    arrives after the first round) stops being needed the moment the leader's assignment takes
    the new metadata. A round still in flight when a poll's time ran out was then never
    finished: the member stayed REBALANCING (every offset commit refused locally), its
    heartbeats off, until the broker expelled it without its knowing. A worker run until drained
    left the group with no offsets committed (tests/integration/test_fleet_membership.py
    reproduces it with 1 ms polls). One difference from Java remains, kafka-python's own: a
    round that completed on the IO loop between two polls is not taken up but sent again (one
    more round, as for any rejoin in kafka-python 3.0.12)."""
    needed = coordinator.need_rejoin

    def need_rejoin() -> bool:
        return needed() or coordinator.rebalance_in_progress()

    coordinator.need_rejoin = need_rejoin


class FleetMembership:
    """This worker's membership of its group through kafka-python (invariant 5).

    A thread of its own polls the group client (joins, syncs; heartbeats have kafka-python's IO
    thread). The rebalance callbacks are handed to the owner (the worker's main loop), which runs
    them in ``serve`` between two batches while the callback waits: the owner's state is
    only ever touched by the owner. So nothing the owner calls may wait on the group client:
    ``commit`` sends group offsets with this member's generation without waiting (``acked``
    keeps what the group accepted, so what it refused or never answered is sent again; the
    changelogs hold the truth);
    ``group_metadata`` is what an exactly-once commit sends with its offsets (librdkafka's
    serialized form, with this member's generation and id); ``request_rejoin`` asks for a
    rebalance (a probing rebalance)."""

    POLL_MS = 200

    def __init__(self, bootstrap_servers: str, group: str, topics: list[str], rules: FleetRules,
                 report: Callable[[], Subscription], listener: FleetListener, *,
                 session_timeout_ms: int = 10_000, heartbeat_interval_ms: int = 1_000,
                 max_poll_interval_ms: int = 300_000, client_id: str = "processor-fleet",
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.group = group
        self.listener = listener
        self.assignor = FleetAssignor(rules, report, self.owned, listener)
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=group, client_id=client_id,
            partition_assignment_strategy=[self.assignor], enable_auto_commit=False,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
            max_poll_interval_ms=max_poll_interval_ms, **dict(client_options or {}))
        self._coordinator = group_coordinator(self.consumer)
        finish_pending_rebalances(self._coordinator)
        self.consumer.subscribe(topics=sorted(topics), listener=_Callbacks(self))
        self.acked: dict[TopicPart, int] = {}       # offsets the group accepted, highest per partition
        self._sent: dict[TopicPart, int] = {}       # offsets sent, highest per partition
        self._commits_in_flight = 0
        self.error: BaseException | None = None     # what stopped the polling thread
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._detached = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll_forever, name=f"{client_id}-poll", daemon=True)
        self._thread.start()

    # -- the polling thread and the hand-over ---------------------------------------------------
    def _poll_forever(self) -> None:
        try:
            while not self._stop.is_set():
                records = self.consumer.poll(timeout_ms=self.POLL_MS)
                if records:   # (every partition is paused: a record here is a bug of this class)
                    raise MembershipError(f"the membership client fetched records of {sorted(records)}")
        except BaseException as exc:
            cause = exc.__cause__ if isinstance(exc, kafka_errors.KafkaError) and exc.__cause__ else exc
            self.error = cause   # (a listener's own error: kafka-python wraps it)
            if not self._stop.is_set():
                log.error("group membership stopped: %s: %s", type(cause).__name__, cause)

    async def hand_over(self, fn: Callable[[], None]) -> None:
        """On kafka-python's IO loop: have ``fn`` run on the owner's thread (at its next ``serve``)
        and wait for it without blocking the loop; once the owner detached (it is closing), run
        it here and now."""
        with self._lock:
            done: KafkaFuture | None = None
            if not self._detached:
                done = KafkaFuture()
                self._calls.put((fn, done))
        if done is None:
            fn()
            return
        await done

    def _settle(self, done: KafkaFuture, error: BaseException | None) -> None:
        """Resolve a hand-over's future on the IO loop (which wakes the callback waiting on it)."""
        def settle() -> None:
            if error is None:
                done.success(None)
            else:
                done.failure(error)
        try:
            self.consumer._net.call_soon_threadsafe(settle)
        except RuntimeError:   # the loop is closed: nobody waits any more
            settle()

    def serve(self) -> bool:
        """Owner: run the callbacks waiting (returns whether there were any); raises
        ``MembershipError`` once the polling thread stopped on an error."""
        ran = False
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                break
            ran = True
            try:
                fn()
            except BaseException as exc:
                self._settle(done, exc)
                raise
            self._settle(done, None)
        if self.error is not None and not self._stop.is_set():
            raise MembershipError(f"the group membership client stopped: {type(self.error).__name__}: "
                                  f"{self.error}") from self.error
        return ran

    def detach(self) -> None:
        """Owner: stop serving; callbacks from now on run on the group client's loop."""
        with self._lock:
            self._detached = True
        self.serve_quietly()

    def serve_quietly(self) -> None:
        while True:
            try:
                fn, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except BaseException as exc:
                self._settle(done, exc)
            else:
                self._settle(done, None)

    # -- what the owner uses -------------------------------------------------------------------
    def owned(self) -> list[TopicPart]:
        """The partitions this member owns now."""
        return sorted((tp.topic, tp.partition) for tp in self.consumer.assignment())

    @property
    def generation(self) -> tuple[int, str]:
        meta = self.consumer.group_metadata()
        return meta.generation_id, meta.member_id

    def commit(self, offsets: Mapping[TopicPart, int]) -> None:
        """Send ``offsets`` with this member's generation (not waiting: see the class docstring)."""
        if not offsets:
            return
        request = {KafkaTopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        sent = dict(offsets)
        with self._lock:
            self._commits_in_flight += 1
            for tp, off in sent.items():
                if off > self._sent.get(tp, -1):
                    self._sent[tp] = off

        def answered(_offsets: Any, response: Any) -> None:
            refused = isinstance(response, Exception)
            with self._lock:
                if not refused:
                    for tp, off in sent.items():
                        if off > self.acked.get(tp, -1):
                            self.acked[tp] = off
                self._commits_in_flight -= 1
            if refused:
                log.info("group offset commit refused (%s): sent again later; the commit units are durable in "
                         "the changelogs", type(response).__name__)

        try:
            self._coordinator.commit_offsets_async(request, callback=answered)
        except BaseException:
            with self._lock:
                self._commits_in_flight -= 1
            raise

    def unaccepted(self, offsets: Mapping[TopicPart, int] | None = None) -> dict[TopicPart, int]:
        """Of ``offsets`` (default: every group offset sent), those the group has not accepted
        (yet): refused, unanswered, or never sent."""
        with self._lock:
            return {tp: off for tp, off in (self._sent if offsets is None else offsets).items()
                    if off > self.acked.get(tp, -1)}

    def _wait_for_commits(self, timeout_s: float) -> None:
        """Until every commit sent is answered (the polling thread still running), at most
        ``timeout_s``; what the group refused meanwhile is sent once more and waited for too."""
        deadline = time.monotonic() + timeout_s
        resent = False
        while time.monotonic() < deadline and self._thread.is_alive():
            with self._lock:
                busy = self._commits_in_flight > 0
            again = self.unaccepted()
            if busy:
                time.sleep(0.02)
                continue
            if not again or resent:
                return
            owned = set(self.owned())
            again = {tp: off for tp, off in again.items() if tp in owned}
            if not again:
                return
            resent = True
            self.commit(again)
        if self._commits_in_flight:
            log.warning("left the group with %d group offset commit(s) unanswered after %.0f s (the commit units "
                        "are durable in the changelogs: the next owner resumes from them)",
                        self._commits_in_flight, timeout_s)

    def group_metadata(self) -> bytes | None:
        """librdkafka's serialized group metadata with this member's generation and id (for
        ``send_offsets_to_transaction``: Kafka fences a stale generation, KIP-447); ``None``
        while in doubt (no generation: Kafka would not fence generation -1, it skips the check)."""
        generation, member_id = self.generation
        if generation < 0:
            return None
        return group_metadata_bytes(self.group, generation, member_id or "",
                                    self.consumer.config.get("group_instance_id"))

    def in_doubt(self) -> bool:
        """This member has no generation (its session expired, it was fenced, it has not joined
        yet): another member may run its tasks already, so it commits nothing until it rejoined."""
        return self.generation[0] < 0

    def request_rejoin(self) -> None:
        """Ask the group for a rebalance (this member's report changed)."""
        self._coordinator.request_rejoin()

    def close(self, timeout_s: float = 10.0) -> None:
        """Leave the group: stop polling, then close the client (its callbacks revoke what this
        member owns: they run on this thread, the owner having detached)."""
        started = time.monotonic()
        self.detach()
        # the last commits answered before leaving (Kafka Streams commits synchronously on close):
        # a commit sent just before and never sent on, or refused, leaves the group's offsets behind
        self._wait_for_commits(timeout_s / 2)
        self._stop.set()
        self._thread.join(timeout_s)
        try:
            self.consumer.close(autocommit=False, timeout_ms=int(timeout_s * 1000))
        finally:
            log.debug("left group %s in %.2f s", self.group, time.monotonic() - started)


# librdkafka setting -> kafka-python's: the user's client settings reach the membership client too
_KAFKA_PYTHON_SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "security.protocol": ("security_protocol", str.upper),
    "ssl.ca.location": ("ssl_cafile", str),
    "ssl.certificate.location": ("ssl_certfile", str),
    "ssl.key.location": ("ssl_keyfile", str),
    "ssl.key.password": ("ssl_password", str),
    "sasl.mechanism": ("sasl_mechanism", str.upper),
    "sasl.mechanisms": ("sasl_mechanism", str.upper),
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", str),
    "client.id": ("client_id", str),
    "session.timeout.ms": ("session_timeout_ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", int),
    "group.instance.id": ("group_instance_id", str),
    "request.timeout.ms": ("request_timeout_ms", int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "enable.ssl.certificate.verification": ("ssl_check_hostname", lambda v: str(v).lower() == "true"),
}
# librdkafka settings with no bearing on group membership (or handled by the data clients only)
_NOT_FOR_MEMBERSHIP = ("bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset",
                       "isolation.level", "enable.partition.eof", "fetch.", "queued.", "socket.",
                       "statistics.", "debug", "log", "partition.assignment.strategy", "api.version",
                       "broker.version", "topic.metadata", "client.dns.lookup", "enable.auto.offset.store",
                       "check.crcs", "error_cb", "logger", "on_commit", "stats_cb", "throttle_cb")


def kafka_python_settings(conf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The consumer settings (librdkafka's names) as kafka-python options, and the names of
    settings that matter to a connection but kafka-python cannot take (to be named in a log
    line, never dropped silently)."""
    out: dict[str, Any] = {}
    unsupported = []
    for k, v in conf.items():
        if k in _KAFKA_PYTHON_SETTINGS:
            name, convert = _KAFKA_PYTHON_SETTINGS[k]
            out[name] = convert(v)
        elif not any(k == p or (p.endswith(".") and k.startswith(p)) for p in _NOT_FOR_MEMBERSHIP):
            unsupported.append(k)
    if out.get("security_protocol", "PLAINTEXT") in ("SSL", "SASL_SSL") and "ssl_cafile" in out:
        out.setdefault("ssl_check_hostname", True)
    return out, sorted(unsupported)
