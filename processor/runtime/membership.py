"""The fleet's group membership client: the group protocol through kafka-python.

confluent-kafka offers only librdkafka's built-in assignors, which carry no user data
(docs/fleet.md "Why the group protocol runs through kafka-python"), so the group protocol
(``processor-fleet``, cooperative, KIP-429) runs through kafka-python's group client, with
``FleetAssignor`` as its assignor hook: the leader's computation is
``processor/runtime/fleet_assignor.py``, what it exchanges ``processor/runtime/fleet_codecs.py``,
the settings ``processor/runtime/membership_settings.py``. Every use of kafka-python's private
attributes (its coordinator, its network client's loop) is confined to this file.

Invariant (the owner's state, on the owner's thread): ``FleetMembership`` runs kafka-python's
group client (a ``KafkaConsumer`` whose partitions are always paused: it never fetches) on a
thread of its own; its rebalance callbacks are run by the owner (``serve``, the worker's main
loop between two batches) while the group client's callback, a coroutine on its IO loop, waits
(heartbeats go on meanwhile), so a revocation or an assignment never lands during a batch.
Offsets committed through it carry its generation, and the group fences a stale one. (The group
client is polled continuously: kafka-python 3.0.12 forgets a join that completed between two
polls with a zero timeout and joins again, forever.)
"""


from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer
from kafka import errors as kafka_errors
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.future import Future as KafkaFuture
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from processor.runtime.fleet_assignor import FleetRules, assign_fleet
from processor.runtime.fleet_codecs import (
    PROTOCOL,
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    group_metadata_bytes,
)

log = logging.getLogger("processor.membership")

TopicPart = tuple[str, int]


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
