"""The leader's computation of the fleet's assignment (pure: no broker, no client).

The leader decodes every member's subscription (``processor/runtime/fleet_codecs.py``), refuses
copies, computes the lags, places the tasks (``processor/runtime/placement.py``), withholds what
another member still owns, and answers each member with its tasks and the fleet's map
(``assign_fleet``; kafka-python's hook that calls it is ``FleetAssignor`` in
``processor/runtime/membership.py``). Kafka Streams' ``StreamsPartitionAssignor`` with its
``TaskAssignor``.

Invariants:

1. **Lags from reported sums.** A member's lag for a task = the highest changelog offset sum any
   member reported for it (the running owner's included) minus its own (all of it when it
   reports none: a task small enough moves at once, KIP-441); ``RUNNING`` stays ``RUNNING``; a
   task nobody reports a sum for is absent (no state anywhere).
2. **Two-phase moves (KIP-429).** A task whose partitions another member reported in
   ``owned_partitions`` this round is not given to its new member in this generation: it stays
   unassigned, its owner revokes it, and the follow-up rebalance gives it over. Meanwhile, where
   its new member holds a copy of its state (a warm-up that caught up, a standby), the task is a
   standby there: the copy stays open and follows the owner's last commits, so the next round
   finds it current and moves the task, rather than finding it closed a round's processing
   behind (beyond ``acceptable_recovery_lag`` on a busy task) and sending the task back to a new
   warm-up.
3. **The protocol's partitions follow the tasks.** A member's assignment names, as Kafka
   partitions, exactly the source partitions of the active tasks it is given; standbys, warm-ups
   and the fleet's map travel only in the user data.
4. **One process, one state directory.** Members reporting the same ``process`` (workers in
   threads of one process, sharing its state directory, as the stream threads of one Kafka
   Streams instance) are each as current as the most current of them for every task, and no
   member keeps a standby or warm-up of a task another member of its process runs or owns:
   it would be the same database (Kafka Streams places standbys per client, not per thread).
5. **One live process per worker id.** Members reporting one ``process`` (worker id) but
   different ``instance``s are live processes sharing a copied state directory: the leader keeps
   the instance that claimed the id first and gives every other one nothing but ``claimed_by``;
   the refused member stops (``CopiedStateDir``) once the refusal outlasts a session timeout
   (``WorkerFleet``: the claimant may be a dead member the group has not expired yet); the
   others are placed as if it were not there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from processor.runtime.fleet_codecs import Assignment, Subscription
from processor.runtime.placement import RUNNING, Placement, TaskKey, place

TopicPart = tuple[str, int]


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
