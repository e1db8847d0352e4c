import pytest

from processor.runtime.fleet_assignor import lags_of, withhold_moving
from processor.runtime.fleet_codecs import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from processor.runtime.placement import RUNNING


def test_subscription_round_trip():
    s = Subscription(server="h:1", process="p1", sums={(0, 1): 5, (1, 0): 7}, running=[(0, 1)])
    assert decode_subscription(encode_subscription(s)) == s
    assert encode_subscription(s)[0] == 1


def test_assignment_round_trip():
    a = Assignment(active=[(0, 0), (1, 2)], standby=[(0, 3)], warmup=[(0, 3)], probing=True,
                   fleet={"h:1": {"active": [(0, 0)], "standby": [(0, 3)]}})
    assert decode_assignment(encode_assignment(a)) == a


@pytest.mark.parametrize("dec", [decode_subscription, decode_assignment])
def test_unknown_version_refused(dec):
    with pytest.raises(ValueError, match="version 2"):
        dec(b"\x02{}")
    with pytest.raises(ValueError, match="empty"):
        dec(b"")


def test_lags_from_sums():
    subs = {"a": Subscription(None, "pa", sums={(0, 0): 100}, running=[(0, 0)]),
            "b": Subscription(None, "pb", sums={(0, 0): 60, (0, 1): 3}),
            "c": Subscription(None, "pc", sums={(0, 1): 10})}
    # a member with no state of a task is behind by all of it
    assert lags_of(subs) == {"a": {(0, 0): RUNNING, (0, 1): 10}, "b": {(0, 0): 40, (0, 1): 7},
                             "c": {(0, 0): 100, (0, 1): 0}}


def test_two_phase_withholds_owned_elsewhere():
    pot = {(0, 0): [("s", 0)], (0, 1): [("s", 1)]}
    owned = {"a": [("s", 0), ("s", 1)], "b": []}
    assert withhold_moving({"a": [(0, 0)], "b": [(0, 1)]}, owned, pot) == {"a": [(0, 0)], "b": []}


def test_assign_fleet_partitions_follow_tasks_and_a_move_waits_a_round():
    from processor.runtime.fleet_assignor import FleetRules, assign_fleet

    rules = FleetRules(partitions_of_task={(0, p): [("a", p), ("b", p)] for p in range(4)}, stateful=set())
    subs = {"m1": Subscription(server="h1:1", process="p1", running=[(0, p) for p in range(4)]),
            "m2": Subscription(server="h2:1", process="p2")}
    owned = {"m1": [(t, p) for t in "ab" for p in range(4)], "m2": []}
    out = assign_fleet(rules, subs, owned)
    # m1 keeps two tasks; the two meant for m2 are withheld while m1 still owns them
    assert len(out["m1"].active) == 2
    assert out["m2"].active == [] and out["m2"].probing
    # the map names the placement's owners, so both servers appear with two tasks each
    assert sorted(len(r["active"]) for r in out["m1"].fleet.values()) == [2, 2]
    # next round: m1 reported only its kept tasks: m2 gets the others
    kept = out["m1"].active
    subs["m1"].running = kept
    out2 = assign_fleet(rules, subs, {"m1": [(t, p) for t in "ab" for _, p in kept], "m2": []})
    assert out2["m1"].active == kept
    assert sorted(out2["m2"].active) == sorted(set((0, p) for p in range(4)) - set(kept))
    assert not out2["m2"].probing


def test_group_metadata_bytes_equal_librdkafkas_own():
    from confluent_kafka import Consumer

    from processor.runtime.fleet_codecs import group_metadata_bytes

    c = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g-meta"})
    try:
        assert c.consumer_group_metadata() == group_metadata_bytes("g-meta", -1, "")
    finally:
        c.close()


def test_a_task_withheld_for_a_round_stays_a_standby_where_it_goes():
    """The probing rebalance after a warm-up caught up: the task is placed on the warm-up's member
    but withheld while its owner revokes it; the warm copy stays a standby there for that round
    (so it follows the owner's last commits, and the next round finds it current), and is
    withheld from nobody else's standbys."""
    from processor.runtime.fleet_assignor import FleetRules, assign_fleet

    tasks = [(0, p) for p in range(4)]
    rules = FleetRules(partitions_of_task={t: [("s", t[1])] for t in tasks}, stateful=set(tasks))
    # m1 runs 3 tasks, m2 runs 1 and its warm-up of (0, 2) has caught up (lag 5)
    subs = {"m1": Subscription(server=None, process="p1", sums={(0, 0): 100, (0, 1): 100, (0, 2): 105},
                               running=[(0, 0), (0, 1), (0, 2)]),
            "m2": Subscription(server=None, process="p2", sums={(0, 2): 100, (0, 3): 100}, running=[(0, 3)])}
    owned = {"m1": [("s", 0), ("s", 1), ("s", 2)], "m2": [("s", 3)]}
    out = assign_fleet(rules, subs, owned)
    assert out["m2"].active == [(0, 3)] and out["m2"].probing   # (0, 2) waits a round...
    assert (0, 2) in out["m2"].standby                          # ...as a standby of m2
    assert (0, 2) not in out["m1"].active and (0, 2) not in out["m1"].standby
    # a member that holds no copy of a withheld task gets none opened for the round
    subs["m2"].sums = {(0, 3): 100}
    out = assign_fleet(rules, subs, owned)
    assert (0, 2) not in out["m2"].standby


def test_members_of_one_process_share_their_state_and_keep_no_standby_beside_each_other():
    """Two workers in threads of one process (one state directory): the one joining is as
    current as the one running every task, so half the tasks move to it without a warm-up, and
    neither keeps a standby of a task the other runs or still owns (the same database); a
    member of another process still gets its standbys."""
    from processor.runtime.fleet_assignor import FleetRules, assign_fleet

    tasks = [(0, p) for p in range(4)]
    rules = FleetRules(partitions_of_task={t: [("s", t[1])] for t in tasks}, stateful=set(tasks), num_standbys=1)
    subs = {"t1": Subscription(server=None, process="p1", sums={t: 50_000 for t in tasks}, running=list(tasks)),
            "t2": Subscription(server=None, process="p1", sums={t: 50_000 for t in tasks})}
    assert lags_of(subs)["t2"] == {t: 0 for t in tasks}
    # a task its process runs without having reported a sum for it (nothing committed yet)
    fresh = {"t1": Subscription(server=None, process="p1", running=[(0, 0)]),
             "t2": Subscription(server=None, process="p1")}
    assert lags_of(fresh) == {"t1": {(0, 0): RUNNING}, "t2": {(0, 0): 0}}
    owned = {"t1": [("s", p) for p in range(4)], "t2": []}
    out = assign_fleet(rules, subs, owned)
    assert len(out["t1"].active) == 2 and out["t2"].active == [] and out["t2"].probing
    assert out["t1"].standby == [] and out["t2"].standby == [] and out["t2"].warmup == []
    # the next round: t1 revoked the two tasks, t2 runs them; still no standby inside the process
    subs["t1"].running = out["t1"].active
    out2 = assign_fleet(rules, subs, {"t1": [("s", p) for _, p in out["t1"].active], "t2": []})
    assert sorted(out2["t1"].active + out2["t2"].active) == tasks and len(out2["t2"].active) == 2
    assert out2["t1"].standby == [] and out2["t2"].standby == []
    # a third member, another process: one standby of every task, there
    subs["t2"].running = out2["t2"].active
    subs["o"] = Subscription(server=None, process="p2")
    owned3 = {"t1": [("s", p) for _, p in out2["t1"].active], "t2": [("s", p) for _, p in out2["t2"].active],
              "o": []}
    out3 = assign_fleet(rules, subs, owned3)
    assert out3["t1"].standby == [] and out3["t2"].standby == []
    assert sorted(out3["o"].standby) == sorted(set(tasks) - set(out3["o"].active))
