"""The fleet's group membership (processor/runtime/membership.py) on the real broker, without a
worker: three members of one group with the ``processor-fleet`` assignor.

What must hold: every task is run by exactly one member and the members differ by at most one
task; every member receives the whole fleet map (every member's application server); a member
that joins later takes tasks over without any member giving up a partition it keeps
(cooperative); a member that leaves hands its tasks to the others; offsets committed through a
member carry its generation."""

from __future__ import annotations

import threading
import time

from kafka.structs import TopicPartition as KafkaTopicPartition

from processor.kafka import clients as kafka
from processor.runtime.fleet_assignor import FleetRules
from processor.runtime.fleet_codecs import Assignment, Subscription
from processor.runtime.membership import FleetListener, FleetMembership, group_coordinator
from tests.integration.helpers import wait_for

TOPICS = ("a", "b")       # two sub-topologies of 4 partitions each: 8 tasks
PARTS = 4
SESSION_MS = 3000         # Tansu closes a rebalance round after about half of it


class Recorder(FleetListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, list]] = []
        self.assignment: Assignment | None = None
        self.generation = -1

    def on_revoked(self, partitions):
        self.events.append(("revoked", partitions))

    def on_assigned(self, partitions, assignment):
        self.events.append(("assigned", partitions))

    def on_lost(self, partitions):
        self.events.append(("lost", partitions))

    def on_assignment(self, assignment, generation):
        self.assignment = assignment
        self.generation = generation


class Member:
    """One membership client whose callbacks a thread of the test serves (as a worker's main loop does)."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], name: str,
                 listener: Recorder | None = None, client_options: dict | None = None) -> None:
        self.name = name
        self.listener = listener or Recorder()
        rules = FleetRules(partitions_of_task={(s, p): [(topics[s], p)] for s in range(2) for p in range(PARTS)},
                           stateful=set())
        self.m = FleetMembership(bootstrap, group, topics, rules,
                                 lambda: Subscription(server=f"{name}:80", process=name), self.listener,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300, client_id=name,
                                 client_options=client_options)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.m.serve()
                time.sleep(0.02)
            self.m.close()
        except BaseException as exc:   # reported by the test
            self.error = exc

    def owned(self) -> list[tuple[str, int]]:
        return self.m.owned()

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive() and self.error is None, self.error


def owners(members: list[Member]) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for m in members:
        for tp in m.owned():
            out.setdefault(tp, []).append(m.name)
    return out


def settled(members: list[Member], topics: list[str]) -> bool:
    """Every partition owned by exactly one member, balanced within one, and the fleet map of every
    member names every member."""
    o = owners(members)
    if sorted(o) != sorted((t, p) for t in topics for p in range(PARTS)) or any(len(v) != 1 for v in o.values()):
        return False
    counts = [len(m.owned()) for m in members]
    if max(counts) - min(counts) > 1:
        return False
    servers = sorted(f"{m.name}:80" for m in members)
    return all(m.listener.assignment is not None and sorted(m.listener.assignment.fleet) == servers
               for m in members)


def test_three_members_balanced_cooperative_and_fenced(kafka_bootstrap, unique, report):
    topics = [f"{t}-{unique}" for t in TOPICS]
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics})
    group = f"fleet-{unique}"
    first, second = Member(kafka_bootstrap, group, topics, "m1"), Member(kafka_bootstrap, group, topics, "m2")
    members = [first, second]
    try:
        started = time.monotonic()
        wait_for(lambda: settled(members, topics), 60, "two members settle")
        report(f"two members settled: {time.monotonic() - started:.1f} s")
        assert sorted(len(m.owned()) for m in members) == [4, 4]
        kept = {m.name: set(m.owned()) for m in members}
        # the fleet map: each server's active tasks, as their partitions
        fleet = first.listener.assignment.fleet
        assert sorted(t for roles in fleet.values() for t in roles["active"]) == \
            sorted((s, p) for s in range(2) for p in range(PARTS))

        third = Member(kafka_bootstrap, group, topics, "m3")
        members.append(third)
        started = time.monotonic()
        wait_for(lambda: settled(members, topics), 90, "three members settle")
        report(f"scale-out 2 -> 3 settled: {time.monotonic() - started:.1f} s")
        # every member's tasks: 8 tasks over 3 members, within one in total and per topic
        per_topic = [[sum(1 for t, _ in m.owned() if t == topic) for m in members] for topic in topics]
        assert sorted(len(m.owned()) for m in members) == [2, 3, 3]
        assert all(max(c) - min(c) <= 1 for c in per_topic), per_topic
        # cooperative: a partition an old member keeps was never revoked from it
        for m in (first, second):
            still = kept[m.name] & set(m.owned())
            revoked = {tuple(tp) for kind, tps in m.listener.events if kind == "revoked" for tp in tps}
            assert not (still & revoked), (m.name, sorted(still & revoked))
            assert not [e for e in m.listener.events if e[0] == "lost"]

        # commits carry the generation; the group metadata names this member
        tp = first.owned()[0]
        first.m.commit({tp: 7})
        wait_for(lambda: first.m.consumer.committed(KafkaTopicPartition(*tp)) == 7 or first.m.commit({tp: 7}),
                 30, "a commit accepted once the group is stable")
        generation, member_id = first.m.generation
        assert generation >= 1 and member_id
        report(f"generation after the scale-out: {generation} (member m1 saw {first.listener.generation})")
        time.sleep(3)
        assert first.m.generation[0] == generation, "the group keeps rebalancing"
        meta = first.m.group_metadata()
        assert meta.startswith(b"CGMDv2:") and member_id.encode() in meta and group.encode() in meta

        # a member leaves: the others take its tasks over
        second.leave()
        members.remove(second)
        started = time.monotonic()
        wait_for(lambda: settled(members, topics), 90, "two members settle after a leave")
        report(f"leave 3 -> 2 settled: {time.monotonic() - started:.1f} s")
        assert sorted(len(m.owned()) for m in members) == [4, 4]

        # a member without a generation (expelled, fenced) is in doubt: no group metadata for an
        # exactly-once commit (Kafka skips the fencing check for generation -1) until it rejoined
        group_coordinator(first.m.consumer).reset_generation()
        assert first.m.in_doubt() and first.m.group_metadata() is None
        wait_for(lambda: not first.m.in_doubt() and settled(members, topics), 60, "the member rejoins")
        assert first.m.group_metadata() is not None
    finally:
        for m in members:
            if m.thread.is_alive():
                m.leave()


class SlowRevoker(Recorder):
    """A listener whose revocation takes longer than the session timeout (a big commit, a flush); it
    samples the group client's heartbeat answers meanwhile."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.heartbeat = None            # the member's kafka-python Heartbeat, set by the test
        self.answers_meanwhile: list[float] = []

    def on_revoked(self, partitions):
        until = time.monotonic() + self.seconds
        while time.monotonic() < until:
            time.sleep(0.25)
            self.answers_meanwhile.append(self.heartbeat.last_receive)
        super().on_revoked(partitions)


def test_a_revocation_longer_than_the_session_keeps_the_member(kafka_bootstrap, unique, report):
    """The callback waits on the owner's thread while kafka-python's loop goes on heartbeating: a
    revocation that takes twice the session timeout neither stops the heartbeats (Kafka expels a
    member that misses them for a session; Tansu tolerates it, so the heartbeats are sampled) nor
    loses the member its tasks."""
    topics = [f"{t}-{unique}" for t in TOPICS]
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics})
    group = f"fleet-slow-{unique}"
    slow = SlowRevoker(2 * SESSION_MS / 1000)
    first = Member(kafka_bootstrap, group, topics, "m1", slow)
    slow.heartbeat = group_coordinator(first.m.consumer).heartbeat
    members = [first]
    try:
        wait_for(lambda: settled(members, topics), 60, "one member settles")
        _, member_id = first.m.generation
        second = Member(kafka_bootstrap, group, topics, "m2")
        members.append(second)
        started = time.monotonic()
        wait_for(lambda: settled(members, topics), 90, "two members settle")
        took = time.monotonic() - started
        answers = sorted(set(slow.answers_meanwhile))
        report(f"scale-out 1 -> 2 with a {slow.seconds:.0f} s revocation: settled in {took:.1f} s; "
               f"{len(answers)} heartbeat answers during the revocation")
        assert [e[0] for e in first.listener.events if e[0] != "assigned"] == ["revoked"]
        assert len(answers) >= 2 * slow.seconds * 1000 / SESSION_MS, answers   # one per heartbeat interval, at least
        assert first.m.generation[1] == member_id, "the slow member was expelled and joined again"
        assert sorted(len(m.owned()) for m in members) == [4, 4]
    finally:
        for m in members:
            if m.thread.is_alive():
                m.leave()


def test_a_rebalance_a_metadata_change_starts_is_finished_however_short_the_polls(apache_kafka_bootstrap, unique,
                                                                                monkeypatch, report):
    """A leader rejoins when its subscribed topics' metadata changed since its assignment (here a
    partition added; at a worker's start, metadata that arrives after the first round). In
    kafka-python 3.0.12 that rejoin is needed only until the leader's assignment takes the new
    metadata: a round still in flight when a poll's time ran out was never finished, and the
    member stayed rebalancing (every offset commit refused, no heartbeats) until the broker
    expelled it. With polls of 1 ms every round straddles polls; the member must end stable in
    the next generation, still the same member, with its commits accepted."""
    from confluent_kafka.admin import AdminClient, NewPartitions
    from kafka.coordinator.base import MemberState

    kafka_bootstrap = apache_kafka_bootstrap   # Apache Kafka's expulsion of a silent member, whatever the run's broker
    monkeypatch.setattr(FleetMembership, "POLL_MS", 1)
    topics = [f"{t}-{unique}" for t in TOPICS]
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics})
    member = Member(kafka_bootstrap, f"fleet-meta-{unique}", topics, "m1",
                    client_options={"metadata_max_age_ms": 300})
    m = member.m
    try:
        wait_for(lambda: settled([member], topics), 60, "the member settles")
        generation, member_id = m.generation
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_partitions([NewPartitions(topics[0], PARTS + 1)])[topics[0]].result(30)
        wait_for(lambda: m.generation[0] > generation, 60, "the rejoin the new partition starts")
        started = time.monotonic()
        wait_for(lambda: m.consumer.group_metadata().state is MemberState.STABLE, 30,
                 f"the member stable in generation {m.generation[0]}")
        took = time.monotonic() - started
        assert m.generation[1] == member_id, "the member was expelled and joined again"
        m.commit({(topics[0], 0): 1})
        wait_for(lambda: not m.unaccepted(), 30, "the group to accept an offset commit")
        report(f"rejoin after a metadata change with 1 ms polls: stable in generation {m.generation[0]} "
               f"{took:.2f} s after it started, the same member, its commit accepted")
    finally:
        member.leave()
