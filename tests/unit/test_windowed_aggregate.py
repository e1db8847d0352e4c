"""Windowed stream aggregations in the driver: tumbling and hopping windows, grace, window close."""

from processor import Emit, StreamsBuilder, TimeWindows, Windowed
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

AGG = "KTABLE-AGGREGATE-0000000001"


def windowed_counts(windows, emit=None):
    b = StreamsBuilder()
    b.stream("clicks").group_by_key().windowed_by(windows).count(emit=emit, name="w").to_stream().to("out")
    return b.build()


def out(driver):
    return [(r.key, r.value, r.timestamp) for r in driver.read_output("out")]


def W(key, start, size=10):
    return Windowed(key, start, start + size)


def test_tumbling_windows_forward_windowed_keys():
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10))) as d:
        for k, ts in [("a", 1), ("a", 9), ("b", 5), ("a", 10)]:
            d.pipe_input("clicks", k, 1, timestamp=ts)
        assert out(d) == [(W("a", 0), 1, 1), (W("a", 0), 2, 9), (W("b", 0), 1, 5), (W("a", 10), 1, 10)]


def test_hopping_windows_update_every_window_that_contains_the_record():
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10).advance_by(5))) as d:
        d.pipe_input("clicks", "a", 1, timestamp=7)
        d.pipe_input("clicks", "a", 1, timestamp=3)
        # an aggregate's timestamp never goes backwards (max of record and aggregate, as Kafka Streams)
        assert out(d) == [(W("a", 0), 1, 7), (W("a", 5), 1, 7), (W("a", 0), 2, 7)]


def test_window_close_with_grace_and_a_late_record():
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10).grace(5), Emit.on_window_close())) as d:
        for k, ts in [("a", 1), ("a", 4), ("b", 8), ("a", 12)]:
            d.pipe_input("clicks", k, 1, timestamp=ts)
        assert out(d) == []
        d.pipe_input("clicks", "a", 1, timestamp=9)    # out of order, within grace (closes at 15)
        assert out(d) == []
        d.pipe_input("clicks", "b", 1, timestamp=15)   # stream time 15: [0, 10) closes
        assert out(d) == [(W("a", 0), 3, 9), (W("b", 0), 1, 8)]
        d.pipe_input("clicks", "a", 1, timestamp=7)    # late: dropped and counted
        d.pipe_input("clicks", "a", 1, timestamp=31)   # [10, 20) closes at 25
        assert out(d) == [(W("a", 10), 1, 12), (W("b", 10), 1, 15)]
        m = d.metrics()[AGG]
        assert (m["late_records_dropped"], m["windows_closed"], m["records_emitted"]) == (1, 4, 4)
        assert d.get_store("w").items() == [(W("a", 30), 1)]   # closed windows are purged
    assert out(d) == []   # shutdown does not emit an open window: it is not final


def test_late_records_are_dropped_under_every_policy():
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10), Emit.on_change())) as d:
        d.pipe_input("clicks", "a", 1, timestamp=25)
        d.pipe_input("clicks", "a", 1, timestamp=5)     # [0, 10) closed at 10 <= 25
        assert out(d) == [(W("a", 20), 1, 25)]
        assert d.metrics()[AGG]["late_records_dropped"] == 1


def test_a_deferred_every_emission_goes_out_before_its_window_closes():
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10), Emit.every(1000))) as d:
        d.pipe_input("clicks", "a", 1, timestamp=1)
        d.pipe_input("clicks", "a", 1, timestamp=2)     # deferred (interval 1000)
        d.pipe_input("clicks", "b", 1, timestamp=10)    # processed, then [0, 10) closes: a's deferred count
        assert out(d) == [(W("a", 0), 1, 1), (W("b", 10), 1, 10), (W("a", 0), 2, 2)]


def test_windowed_output_key_layout():
    """Kafka Streams' TimeWindowedSerde layout: key bytes then the 8-byte big-endian start."""
    with TopologyTestDriver(windowed_counts(TimeWindows.of(10))) as d:
        d.pipe_input("clicks", "a", 1, timestamp=12)
        raw = d.read_output("out", Serdes.bytes(), Serdes.bytes())
        assert [(r.key, r.value) for r in raw] == [(b"a" + (10).to_bytes(8, "big"), b"1")]


def test_stream_time_is_the_aggregates_own():
    """A record filtered out before the aggregate does not move its stream time (Kafka Streams'
    observed stream time), so it closes no window."""
    b = StreamsBuilder()
    b.stream("clicks").filter(lambda k, v: v != "noise").group_by_key() \
        .windowed_by(TimeWindows.of(10)).count(emit=Emit.on_window_close(), name="w").to_stream().to("out")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("clicks", "k", "x", timestamp=5)
        d.pipe_input("clicks", "k", "noise", timestamp=100)
        d.pipe_input("clicks", "k", "x", timestamp=7)
        d.pipe_input("clicks", "k", "x", timestamp=10)
        assert out(d) == [(W("k", 0), 2, 7)]
        assert d.metrics()["KTABLE-AGGREGATE-0000000002"]["late_records_dropped"] == 0


def test_windowed_aggregations_take_a_null_value_and_plain_ones_skip_it():
    """Kafka Streams' time and session windowed aggregations skip only a null key and hand a
    null value to the aggregator (a count counts it); its sliding and plain aggregations skip
    both (the sliding case found by tests/reference/)."""
    from processor import SessionWindows, SlidingWindows

    b = StreamsBuilder()
    g = b.stream("clicks").group_by_key()
    g.count(name="plain")
    g.windowed_by(TimeWindows.of(10)).count(name="time")
    g.windowed_by(SessionWindows.with_inactivity_gap(5).grace(100)).count(name="session")
    g.windowed_by(SlidingWindows.of_time_difference_and_grace(10, 100)).count(name="sliding")
    g.windowed_by(TimeWindows.of(10)).aggregate(lambda: [], lambda k, v, agg: agg + [v], name="seen")
    with TopologyTestDriver(b.build()) as d:
        for v, ts in (({"x": 1}, 1), (None, 2), ({"x": 3}, 3)):
            d.pipe_input("clicks", "a", v, timestamp=ts)
        d.pipe_input("clicks", None, {"x": 4}, timestamp=4)    # a null key: skipped everywhere
        assert d.get_store("plain").get("a") == 2
        assert d.get_store("time").get(Windowed("a", 0, 10)) == 3
        assert d.get_store("session").get(Windowed("a", 1, 3)) == 3
        assert d.get_store("sliding").get(Windowed("a", 0, 10)) == 2
        assert d.get_store("seen").get(Windowed("a", 0, 10)) == [{"x": 1}, None, {"x": 3}]
