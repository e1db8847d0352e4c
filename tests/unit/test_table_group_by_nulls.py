"""``KTable.group_by`` selectors that return None, or a pair whose key or value is None: that side
of the change is skipped and counted, the other side goes on (Kafka Streams'
``KTableRepartitionMap``), under every on-error policy (no TypeError, nothing dead-lettered)."""

import pytest

from processor import StreamsBuilder
from processor.testing import TopologyTestDriver

GROUP_BY = "KTABLE-SELECT-0000000001"


def selector(key, row):
    if row["g"] == "none":
        return None
    if row["g"] == "nokey":
        return None, row["n"]
    if row["g"] == "noval":
        return "x", None
    return row["g"], row["n"]


def topology():
    b = StreamsBuilder()
    b.table("rows", store_name="rows").group_by(selector).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="sums").to_stream().to("out")
    return b.build()


HISTORY = [
    ("a", {"g": "x", "n": 1}),       # x: 1
    ("b", {"g": "none", "n": 5}),    # no group
    ("a", {"g": "none", "n": 2}),    # leaves x for no group: x: 0
    ("a", {"g": "y", "n": 3}),       # from no group into y: y: 3
    ("c", {"g": "nokey", "n": 4}),   # no group
    ("c", {"g": "x", "n": 6}),       # x: 6
    ("c", {"g": "noval", "n": 7}),   # a null value: x loses 6, gains nothing: x: 0
    ("a", None),                     # y: 0
    ("b", None),                     # was in no group: nothing
]


def model(history):
    """Plain Python: the sum of each group's current members (rows whose pair has a key and a
    value), emitted at each change of a group's sum-relevant membership."""
    rows, sums, out = {}, {}, []
    for ts, (k, v) in enumerate(history):
        old = rows.get(k)
        old_pair = selector(k, old) if old is not None else None
        new_pair = selector(k, v) if v is not None else None
        old_pair = old_pair if old_pair and None not in old_pair else None
        new_pair = new_pair if new_pair and None not in new_pair else None
        if old_pair:
            sums[old_pair[0]] -= old_pair[1]
            if not (new_pair and new_pair[0] == old_pair[0]):
                out.append((old_pair[0], sums[old_pair[0]], ts))
        if new_pair:
            sums[new_pair[0]] = sums.get(new_pair[0], 0) + new_pair[1]
            out.append((new_pair[0], sums[new_pair[0]], ts))
        rows[k] = v
    return out


@pytest.mark.parametrize("on_error", ["dlq", "skip", "fail"])
def test_a_side_in_no_group_is_skipped_and_counted(on_error):
    with TopologyTestDriver(topology(), application_id="app", on_error=on_error) as d:
        for ts, (k, v) in enumerate(HISTORY):
            d.pipe_input("rows", k, v, timestamp=ts)
        got = [(r.key, r.value, r.timestamp) for r in d.read_output("out")]
        assert d.read_output("app-dlq") == []
        assert d.get_store("sums").items() == [("x", 0), ("y", 0)]
        assert d.metrics()[GROUP_BY]["no_group"] == 4     # b, a's second row, c's nokey and noval rows
    assert got == [("x", 1, 0), ("x", 0, 2), ("y", 3, 3), ("x", 6, 5), ("x", 0, 6), ("y", 0, 7)]
    assert got == model(HISTORY)


def test_a_selector_returning_no_pair_at_all_is_still_a_user_error():
    b = StreamsBuilder()
    b.table("rows").group_by(lambda k, v: "just-a-key").count(name="c")
    with TopologyTestDriver(b.build(), application_id="app") as d:
        d.pipe_input("rows", "a", {"g": "x"}, timestamp=1)
        [dead] = d.read_output("app-dlq")
    assert b"ValueError: too many values to unpack" in dict(dead.headers)["__streams.errors.message"]
