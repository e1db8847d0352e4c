import pytest

from processor.runtime.membership import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    lags_of,
    withhold_moving,
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
    assert lags_of(subs) == {"a": {(0, 0): RUNNING}, "b": {(0, 0): 40, (0, 1): 7}, "c": {(0, 1): 0}}


def test_two_phase_withholds_owned_elsewhere():
    pot = {(0, 0): [("s", 0)], (0, 1): [("s", 1)]}
    owned = {"a": [("s", 0), ("s", 1)], "b": []}
    assert withhold_moving({"a": [(0, 0)], "b": [(0, 1)]}, owned, pot) == {"a": [(0, 0)], "b": []}
