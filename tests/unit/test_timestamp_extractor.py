"""Timestamp extractors (issue 34): ``StreamsBuilder.stream / table / global_table(...,
timestamp_extractor=fn)``, ``fn(key, value, record_timestamp) -> ms``.

The extracted time is the record's time everywhere: windows, joins, stream time, output
timestamps, a table row's timestamp. An extractor that raises, or returns anything but a
non-negative integer, makes the record a bad one under the on-error policy: dead-lettered as it
was (its bytes and broker timestamp) with the reason naming the extractor, skipped and counted,
or fatal naming topic, partition, offset and step. Never silently the broker time."""

import json

import pytest

from processor import StreamsBuilder, TimeWindows
from processor.errors import UserFunctionError
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def event_time(k, v, ts):
    return v["t"]


def windowed_topology():
    b = StreamsBuilder()
    s = b.stream("events", timestamp_extractor=event_time)
    s.group_by_key().windowed_by(TimeWindows.of(100).grace(50)).count(name="per-100").to_stream().to("counts")
    s.map_values(lambda v: v["x"]).to("copied")
    return b.build()


def test_windows_and_output_timestamps_follow_the_event_time():
    # broker timestamps rise; event times come from the payload, one of them older
    events = [("a", {"t": 1_050, "x": 1}), ("a", {"t": 1_120, "x": 2}), ("a", {"t": 1_010, "x": 3}),
              ("b", {"t": 1_230, "x": 4}), ("a", {"t": 1_040, "x": 5})]
    with TopologyTestDriver(windowed_topology()) as d:
        for i, (k, v) in enumerate(events):
            d.pipe_input("events", k, v, timestamp=5_000_000 + i)
        copied = [(r.key, r.value, r.timestamp) for r in d.read_output("copied")]
        counts = [(r.key, r.value, r.timestamp) for r in d.read_output("counts")]
    assert copied == [("a", 1, 1_050), ("a", 2, 1_120), ("a", 3, 1_010), ("b", 4, 1_230), ("a", 5, 1_040)]
    # the model: windows of 100 and grace 50 by event time (stream time is the largest event
    # time: 1,040 comes after 1,230 moved it past 1,000 + 100 + 50); a window's result at the
    # largest event time in it
    assert [(k.key, k.start, n, ts) for k, n, ts in counts] == [
        ("a", 1_000, 1, 1_050), ("a", 1_100, 1, 1_120), ("a", 1_000, 2, 1_050), ("b", 1_200, 1, 1_230)]


def test_a_table_row_keeps_its_event_time():
    b = StreamsBuilder()
    b.table("users", store_name="users", timestamp_extractor=event_time).to_stream().to("changes")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("users", "u1", {"t": 7, "r": "A"}, timestamp=900_000)
        d.pipe_input("users", "u1", {"t": 9, "r": "B"}, timestamp=900_001)
        changes = [(r.key, r.value["r"], r.timestamp) for r in d.read_output("changes")]
        task = d.tasks[0]
        stored = task.stores.store("users").get(Serdes.string().serialize("u1"))
    assert changes == [("u1", "A", 7), ("u1", "B", 9)]
    assert int.from_bytes(stored[:8], "big", signed=True) == 9   # the row's timestamp: its event time


def test_a_global_table_row_keeps_its_event_time_and_skips_a_failing_extraction():
    b = StreamsBuilder()
    g = b.global_table("regions", name="regions", timestamp_extractor=event_time)
    b.stream("clicks").join(g, lambda c, r: {"c": c["n"], "r": r["r"]}, key_selector=lambda k, v: k).to("out")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("regions", "u1", {"t": 42, "r": "A"}, timestamp=900_000)
        d.pipe_input("regions", "u2", {"r": "B"}, timestamp=900_001)   # no "t": skipped, not broker time
        d.pipe_input("clicks", "u1", {"n": 1}, timestamp=100)
        d.pipe_input("clicks", "u2", {"n": 2}, timestamp=101)
        out = [(r.key, r.value, r.timestamp) for r in d.read_output("out")]
        store = d.global_stores["regions"]
        row = store.get(Serdes.string().serialize("u1"))
        assert store.get(Serdes.string().serialize("u2")) is None
    assert out == [("u1", {"c": 1, "r": "A"}, 100)]
    assert int.from_bytes(row[:8], "big", signed=True) == 42


def bad_topology():
    def extract(k, v, ts):
        if v["t"] == "raise":
            raise KeyError("no time here")
        return v["t"]

    b = StreamsBuilder()
    b.stream("events", timestamp_extractor=extract).map_values(lambda v: v["x"]).to("out")
    return b.build()


BAD = [({"t": "raise", "x": 1}, "raised KeyError"), ({"t": -5, "x": 2}, "returned -5"),
       ({"t": "soon", "x": 3}, "returned 'soon'"), ({"t": 1.5, "x": 4}, "returned 1.5"),
       ({"t": None, "x": 5}, "returned None"), ({"t": True, "x": 6}, "returned True")]


@pytest.mark.parametrize("policy", ["dlq", "skip"])
def test_a_failing_extractor_is_a_bad_record_under_the_policy(policy):
    records = [({"t": 10, "x": 0}, None)] + BAD + [({"t": 20, "x": 9}, None)]
    with TopologyTestDriver(bad_topology(), on_error=policy) as d:
        for i, (v, _) in enumerate(records):
            d.pipe_raw("events", b"k", json.dumps(v).encode(), timestamp=1_000 + i)
        out = [(r.value, r.timestamp) for r in d.read_output("out")]
        dlq = d.read_output(d.dlq_topic, Serdes.bytes(), Serdes.bytes())
        metrics = d.metrics()["task"]
    assert out == [(0, 10), (9, 20)]   # the good ones, at their event times
    if policy == "dlq":
        # each bad record as it was (value bytes, broker timestamp), the reason naming the extractor
        assert [(json.loads(r.value), r.timestamp) for r in dlq] == [(v, 1_001 + i) for i, (v, _) in enumerate(BAD)]
        reasons = [dict(r.headers)["__streams.errors.message"].decode() for r in dlq]
        for reason, (_, why) in zip(reasons, BAD, strict=False):
            assert "timestamp extractor" in reason and why in reason, reason
        assert metrics["dead_lettered"] == len(BAD)
    else:
        assert dlq == []
        assert metrics["skipped_poison"] == len(BAD)


def test_a_failing_extractor_under_fail_names_the_record_and_step():
    with TopologyTestDriver(bad_topology(), on_error="fail") as d:
        d.pipe_raw("events", b"k", json.dumps({"t": 10, "x": 0}).encode(), timestamp=1)
        with pytest.raises(UserFunctionError) as err:
            d.pipe_raw("events", b"k", json.dumps({"t": -1, "x": 1}).encode(), timestamp=2)
    msg = str(err.value)
    assert "events[0]@1" in msg and "KSTREAM-SOURCE" in msg and "returned -1" in msg, msg


def test_an_extractor_must_be_a_function():
    from processor.errors import TopologyError

    with pytest.raises(TopologyError, match="timestamp_extractor must be a function"):
        StreamsBuilder().stream("events", timestamp_extractor=5)


def test_a_table_with_an_extractor_cannot_reuse_its_source_topic():
    from processor.errors import TopologyError

    b = StreamsBuilder()
    b.table("users", timestamp_extractor=event_time).to_stream().to("out")
    with pytest.raises(TopologyError, match="timestamp extractor"):
        b.build(reuse_source_topics=True)


def test_one_topic_read_with_two_different_extractors_is_refused():
    from processor.errors import TopologyError

    b = StreamsBuilder()
    b.stream("events").merge(b.stream("events", timestamp_extractor=event_time)).to("out")
    with pytest.raises(TopologyError, match="different timestamp extractors"):
        b.build()


def test_an_integral_result_is_taken_and_an_extraction_failure_changes_nothing_and_writes_nothing():
    import numpy as np

    b = StreamsBuilder()
    b.stream("events", timestamp_extractor=lambda k, v, ts: np.int64(v["t"])).group_by_key().count(name="c") \
        .to_stream().to("counts")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("events", "a", {"t": 7}, timestamp=100)
        d.pipe_input("events", "a", {"x": 1}, timestamp=101)    # no t: dead-lettered, the count unchanged
        d.pipe_input("events", "a", {"t": 9}, timestamp=102)
        counts = [(r.key, r.value, r.timestamp) for r in d.read_output("counts")]
        task = d.tasks[0]
    assert counts == [("a", 1, 7), ("a", 2, 9)]
    assert task.failed_in_processing == {}   # failed before any write: no run again in the backfill
    assert task.dead_lettered == 1
