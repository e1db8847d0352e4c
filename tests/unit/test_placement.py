"""The fleet's placement rule (processor/runtime/placement.py): balance, stickiness, no cold move,
standbys and warm-ups, over fixed scenarios and random fleets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.runtime.placement import RUNNING, Placement, place


def tasks_of(*partitions_per_sub: int) -> list[tuple[int, int]]:
    return [(s, p) for s, n in enumerate(partitions_per_sub) for p in range(n)]


def reported(placement: Placement, standby_lag: int = 0, members=None) -> dict:
    """What each member reports after running ``placement`` for a while: RUNNING for its active
    tasks, ``standby_lag`` for its standby copies."""
    out = {}
    for m in members if members is not None else placement.active:
        lags = {t: standby_lag for t in placement.standby.get(m, [])}
        lags.update({t: RUNNING for t in placement.active.get(m, [])})
        out[m] = lags
    return out


def counts(placement: Placement) -> list[int]:
    return [len(placement.active[m]) for m in sorted(placement.active)]


def per_sub_spread(placement: Placement) -> int:
    subs = {t[0] for ts in placement.active.values() for t in ts}
    return max((max(sum(1 for t in ts if t[0] == s) for ts in placement.active.values())
                - min(sum(1 for t in ts if t[0] == s) for ts in placement.active.values())) for s in subs)


def check_invariants(tasks, lags, placement: Placement, stateful, num_standbys, acceptable):
    owner = placement.owner()
    assert sorted(owner) == sorted(tasks)                        # 1: each task runs once
    assert sum(counts(placement)) == len(tasks)
    members = sorted(lags)
    for t in stateful:
        copies = [m for m in members if t in placement.standby[m]]
        warming = [m for m in members if t in placement.warmup[m]]
        assert owner[t] not in copies
        assert len(warming) <= 1
        assert len(copies) - len(warming) == min(num_standbys, len(members) - 1 - len(warming))   # 5, besides
        a = owner[t]
        lag_a = lags[a].get(t)
        a_current = lag_a is not None and (lag_a == RUNNING or lag_a <= acceptable)
        if not a_current:                                            # 4: no cold move past a closer copy
            closer = [m for m in members if lags[m].get(t) is not None and
                      (lag_a is None or lags[m][t] < lag_a)]
            assert not closer, (t, a, closer)
    for m in members:
        assert set(placement.warmup[m]) <= set(placement.standby[m])
    if not placement.probing:                                       # 2: balanced when nothing waits
        assert max(counts(placement)) - min(counts(placement)) <= 1
        assert per_sub_spread(placement) <= 1


def test_a_fresh_fleet_is_balanced_over_all_sub_topologies():
    # the case: 3 workers, two sub-topologies of 4 partitions: 4/2/2 under range
    p = place(tasks_of(4, 4), {"a": {}, "b": {}, "c": {}})
    assert counts(p) == [3, 3, 2]
    assert per_sub_spread(p) == 1
    assert not p.probing
    assert p.active == {"a": [(0, 0), (0, 3), (1, 0)], "b": [(0, 1), (1, 1), (1, 3)],
                        "c": [(0, 2), (1, 2)]}


def test_the_same_members_keep_their_tasks():
    tasks = tasks_of(4, 4, 3)
    first = place(tasks, {"a": {}, "b": {}, "c": {}}, stateful=tasks, num_standbys=1)
    again = place(tasks, reported(first), stateful=tasks, num_standbys=1)
    assert again.active == first.active
    assert again.standby == first.standby
    assert not again.probing


def test_a_stateless_scale_out_moves_only_what_balance_needs():
    tasks = tasks_of(4, 4)
    three = place(tasks, {"a": {}, "b": {}, "c": {}})
    lags = reported(three)
    lags["d"] = {}
    four = place(tasks, lags)
    assert counts(four) == [2, 2, 2, 2]
    moved = [t for t, m in four.owner().items() if three.owner()[t] != m]
    assert len(moved) == 2 and all(four.owner()[t] == "d" for t in moved)


def test_a_stateful_scale_out_warms_up_before_moving():
    tasks = tasks_of(4, 4)
    three = place(tasks, {"a": {}, "b": {}, "c": {}}, stateful=tasks)
    lags = reported(three)
    lags["d"] = {}
    step1 = place(tasks, lags, stateful=tasks, max_warmups=2)
    assert step1.active == three.active | {"d": []}       # nothing moves to a cold member
    assert step1.probing
    assert len(step1.warmup["d"]) == 2                     # two tasks warm up there
    # once the warm-ups caught up, the tasks move to d and the fleet is balanced
    lags = reported(step1)
    step2 = place(tasks, lags, stateful=tasks, max_warmups=2)
    assert counts(step2) == [2, 2, 2, 2]
    assert sorted(step2.active["d"]) == step1.warmup["d"]
    assert not step2.probing


def test_a_lost_member_s_tasks_go_where_their_standbys_are():
    tasks = tasks_of(6)
    two = place(tasks, {"a": {}, "b": {}}, stateful=tasks, num_standbys=1)
    assert two.standby["a"] == two.active["b"] and two.standby["b"] == two.active["a"]
    lags = reported(two, standby_lag=3)
    three = place(tasks, {**lags, "c": {}}, stateful=tasks, num_standbys=1)
    lags = reported(three, standby_lag=3)
    survivors = {m: lags[m] for m in ("a", "b")}            # c is killed
    after = place(tasks, survivors, stateful=tasks, num_standbys=1)
    for t in three.active["c"]:
        new_owner = after.owner()[t]
        assert t in three.standby[new_owner], (t, new_owner)   # no restore from scratch


def test_a_warm_up_comes_beside_the_standbys_and_a_current_standby_stays():
    tasks = tasks_of(4)
    three = place(tasks, {"a": {}, "b": {}, "c": {}}, stateful=tasks, num_standbys=1)
    lags = reported(three)
    lags["d"] = {}
    four = place(tasks, lags, stateful=tasks, num_standbys=1)
    assert four.probing
    assert four.warmup["d"]
    for t in four.warmup["d"]:
        # the standby it had stays where it was: a failover during the warm-up finds it
        assert [x for x in "abc" if t in three.standby[x]] == [x for x in "abc" if t in four.standby[x]]


def test_a_scale_out_moves_no_task_between_the_members_that_were_there():
    tasks = tasks_of(1, 4, 4)
    two = place(tasks, {"w0": {}, "w1": {}}, stateful=tasks, num_standbys=1)
    lags = reported(two)
    lags["new"] = {}
    three = place(tasks, lags, stateful=tasks, num_standbys=1)
    before, after = two.owner(), three.owner()
    assert [t for t in tasks if after[t] != before[t]] == []      # nothing moves before the warm-ups


def test_warm_ups_are_at_least_one():
    with pytest.raises(ValueError, match="max_warmups must be at least 1"):
        place(tasks_of(4), {"a": {}}, max_warmups=0)


def test_no_member_is_current_the_closest_restores():
    tasks = [(0, 0)]
    p = place(tasks, {"a": {(0, 0): 50_000}, "b": {(0, 0): 20_000}, "c": {}}, stateful=tasks,
              acceptable_recovery_lag=100)
    assert p.owner() == {(0, 0): "b"}


@settings(max_examples=300, deadline=None)
@given(subs=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       members=st.integers(1, 5),
       num_standbys=st.integers(0, 2),
       state=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 5),
                                st.sampled_from([RUNNING, 0, 50, 5_000, 50_000])), max_size=40))
def test_random_fleets_keep_every_rule_and_converge(subs, members, num_standbys, state):
    tasks = tasks_of(*subs)
    names = [f"w{i}" for i in range(members)]
    lags: dict = {m: {} for m in names}
    for mi, s, p, lag in state:
        if mi < members and s < len(subs) and p < subs[s]:
            lags[names[mi]][(s, p)] = lag
    acceptable = 100
    placement = place(tasks, lags, stateful=tasks, num_standbys=num_standbys, acceptable_recovery_lag=acceptable)
    check_invariants(tasks, lags, placement, tasks, num_standbys, acceptable)
    # the fleet runs it (actives current, copies caught up), then the leader places again: with
    # at least 2 copies warming up per round, the balanced target is reached within the bound
    bound = len(tasks) // 2 + 2
    for _ in range(bound):
        if not placement.probing:
            break
        lags = reported(placement, members=names)
        placement = place(tasks, lags, stateful=tasks, num_standbys=num_standbys,
                          acceptable_recovery_lag=acceptable)
        check_invariants(tasks, lags, placement, tasks, num_standbys, acceptable)
    assert not placement.probing
    assert max(counts(placement)) - min(counts(placement)) <= 1
    settled = place(tasks, reported(placement, members=names), stateful=tasks, num_standbys=num_standbys,
                    acceptable_recovery_lag=acceptable)
    assert settled.active == placement.active
