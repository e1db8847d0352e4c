"""Where a fleet's tasks run: balanced, sticky active tasks, standby replicas and warm-ups (pure).

``place`` is the rule the group's leader applies at every rebalance. It knows each member's
report: for every task it holds local state of, how many changelog records that state is behind
(``RUNNING`` for a task it runs as active right now, whose state is current by definition). It
returns which member runs which task, which members keep standby copies, and whether a follow-up
("probing") rebalance is needed because a task waits on a warm-up.

Invariants of the result (checked by ``tests/unit/test_placement.py`` over random fleets):

1. **Every task runs on exactly one member.** A task is a sub-topology's partition number, so
   co-partitioned inputs stay together.
2. **Balance.** The *target* placement gives every member the same number of tasks within one,
   in total and within one per sub-topology (both are always possible together: each
   sub-topology's remainder goes to the members with the fewest tasks so far). The result
   departs from the target only where rule 4 keeps a task on a caught-up member while the
   target member warms up; then ``probing`` is true.
3. **Stickiness.** A member keeps the tasks it runs as far as its quota allows. A member over
   its quota gives up first the tasks another member is caught up on (they move at no cost).
4. **No cold move.** A stateful task goes to a member whose state is more than
   ``acceptable_recovery_lag`` records behind only if no member has it closer; otherwise it stays
   on (or goes to) the least loaded caught-up member, and the member the balance wants it on
   gets a warm-up replica to catch up on (at most ``max_warmups``, at least 1, in one placement;
   beside the standbys, not instead of one). Kafka Streams' rule (KIP-441).
5. **Standbys.** A stateful task has ``min(num_standbys, members - 1)`` standby copies besides its
   warm-up, on members other than its active one, at most one per member: those already
   closest to current first (a standby that exists stays), then the members with the fewest;
   with ``process`` given, at most one copy per process (members of one process share a state
   directory), so fewer where the other processes run out.

Kafka Streams' ``HighAvailabilityTaskAssignor`` is the reference for the rules (its rounds of
round-robin and balancing are not copied: the target here is computed sticky in one pass).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

TaskKey = tuple[int, int]   # (sub-topology, partition)

RUNNING = -1               # the lag a member reports for a task it runs as active now
NO_STATE = 1 << 62         # the lag of a task a member holds no state of


@dataclass
class Placement:
    """Per member (``member id -> sorted tasks``): the tasks it runs, the standby copies it keeps
    (warm-ups included) and, among those, the warm-ups (copies of a task that is meant to move
    to it once it caught up). ``probing``: some task waits on a warm-up, so the leader asks for
    another rebalance later."""

    active: dict[str, list[TaskKey]] = field(default_factory=dict)
    standby: dict[str, list[TaskKey]] = field(default_factory=dict)
    warmup: dict[str, list[TaskKey]] = field(default_factory=dict)
    probing: bool = False

    def owner(self) -> dict[TaskKey, str]:
        """``task -> member`` running it."""
        return {t: m for m, ts in self.active.items() for t in ts}


def place(tasks: Iterable[TaskKey], lags: Mapping[str, Mapping[TaskKey, int]], *,
          stateful: Iterable[TaskKey] = (), num_standbys: int = 0, acceptable_recovery_lag: int = 10_000,
          max_warmups: int = 2, process: Mapping[str, str] | None = None) -> Placement:
    """The placement of ``tasks`` over the members of ``lags`` (``member -> {task: lag}``; a
    task missing from a member's map: no state there). ``stateful``: the tasks with stores (only
    those have standbys, warm-ups and lags that matter). ``process``: member -> its process;
    members of one process share a state directory, so a standby copy goes to another process
    (rule 5 counts processes, as Kafka Streams counts clients, not threads)."""
    if max_warmups < 1:
        raise ValueError(f"max_warmups must be at least 1 (a task waiting on a warm-up would never move), "
                         f"not {max_warmups}")
    members = sorted(lags)
    result = Placement(active={m: [] for m in members}, standby={m: [] for m in members},
                       warmup={m: [] for m in members})
    if not members:
        return result
    stateful_set = set(stateful)

    def lag(m: str, t: TaskKey) -> int:
        v = lags[m].get(t)
        if v is None or t not in stateful_set and v != RUNNING:
            return NO_STATE
        return v

    def caught_up(m: str, t: TaskKey) -> bool:
        v = lag(m, t)
        return v == RUNNING or v <= acceptable_recovery_lag

    target = _balanced_target(sorted(set(tasks)), members, lag, caught_up, stateful_set)

    # rule 4: a stateful task whose target member is behind stays where it is current
    active = dict(target)
    load = {m: 0 for m in members}
    for m in active.values():
        load[m] += 1
    intended: dict[TaskKey, str] = {}
    for t in sorted(stateful_set & set(active)):
        dest = active[t]
        if caught_up(dest, t):
            continue
        current = [m for m in members if caught_up(m, t)]
        if current:   # (the member running it first: a move between two current members buys nothing)
            src = min(current, key=lambda m: (lag(m, t) != RUNNING, load[m], m))
        else:
            src = min(members, key=lambda m: (lag(m, t), load[m], m))
            if lag(src, t) >= lag(dest, t):
                continue   # nobody is closer: the target restores it
        active[t] = src
        load[dest] -= 1
        load[src] += 1
        intended[t] = dest
    for t, m in sorted(active.items()):
        result.active[m].append(t)

    # rule 5 and the warm-ups
    slots = min(num_standbys, len(members) - 1)
    copies = {m: 0 for m in members}
    warmups_left = max_warmups
    for t in sorted(stateful_set & set(active)):
        holders = {active[t]}
        target_member = intended.get(t)
        if target_member is not None and warmups_left > 0:
            # (on top of the standbys: a current standby stays, a failover still finds it)
            warmups_left -= 1
            result.standby[target_member].append(t)
            result.warmup[target_member].append(t)
            holders.add(target_member)
            copies[target_member] += 1
            result.probing = True
        added = 0
        for m in sorted((m for m in members if m not in holders),
                        key=lambda m: (lag(m, t), copies[m], m)):
            if added == slots:
                break
            if process is not None and any(process.get(h) == process.get(m) for h in holders):
                continue   # (that state directory holds it already)
            result.standby[m].append(t)
            holders.add(m)
            copies[m] += 1
            added += 1
    for m in members:
        result.standby[m].sort()
        result.warmup[m].sort()
    return result


def _balanced_target(tasks: list[TaskKey], members: list[str], lag: Callable[[str, TaskKey], int],
                     caught_up: Callable[[str, TaskKey], bool], stateful: set[TaskKey]) -> dict[TaskKey, str]:
    """Rules 2 and 3: per sub-topology, every member gets its quota (the remainder to the members
    with the fewest tasks so far); a member keeps the tasks it runs up to its quota, the others go
    to the members with room whose state is closest."""
    by_sub: dict[int, list[TaskKey]] = {}
    for t in tasks:
        by_sub.setdefault(t[0], []).append(t)
    total = {m: 0 for m in members}
    owner: dict[TaskKey, str] = {}
    for sub in sorted(by_sub):
        ts = by_sub[sub]
        base, extra = divmod(len(ts), len(members))
        running = {m: [t for t in ts if lag(m, t) == RUNNING] for m in members}
        order = sorted(members, key=lambda m: (total[m], -len(running[m]), m))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
        mine: dict[str, int] = {m: 0 for m in members}
        for m in members:
            # over quota: keep first the tasks nobody else is current on (moving them costs a restore)
            keep = sorted((t for t in running[m] if t not in owner),
                          key=lambda t: (sum(1 for o in members if o != m and caught_up(o, t)) if t in stateful
                                         else 0, t))
            for t in keep[:quota[m]]:
                owner[t] = m
                mine[m] += 1
        for t in ts:
            if t in owner:
                continue
            m = min((m for m in members if mine[m] < quota[m]), key=lambda m: (lag(m, t), mine[m], m))
            owner[t] = m
            mine[m] += 1
        for m in members:
            total[m] += mine[m]
    return owner
