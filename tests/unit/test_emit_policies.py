"""Emission policies on stream aggregations in the driver: exact output sequences with timestamps."""

import pytest

from processor import Emit, StreamsBuilder
from processor.errors import TopologyError
from processor.testing import TopologyTestDriver

AGG = "KTABLE-AGGREGATE-0000000001"


def counts(emit, kind="count"):
    b = StreamsBuilder()
    grouped = b.stream("clicks").group_by_key()
    if kind == "count":
        table = grouped.count(emit=emit, name="counts")
    else:  # the latest value
        table = grouped.reduce(lambda agg, v: v, emit=emit, name="counts")
    table.to_stream().to("out")
    return b.build()


def out(driver):
    return [(r.key, r.value, r.timestamp) for r in driver.read_output("out")]


def test_default_policy_is_on_change():
    b = StreamsBuilder()
    b.stream("clicks").group_by_key().count(name="c").to_stream().to("out")
    assert "(emit: Emit.on_change())" in b.build().describe()


def test_on_update_forwards_every_update_with_the_last_emitted_value_as_old():
    with TopologyTestDriver(counts(Emit.on_update(), kind="latest")) as d:
        for v, ts in [(1, 10), (1, 20), (2, 30)]:
            d.pipe_input("clicks", "a", v, timestamp=ts)
        assert out(d) == [("a", 1, 10), ("a", 1, 20), ("a", 2, 30)]
        assert d.get_store("counts").get_with_timestamp("a") == (2, 30)
        assert d.metrics()[AGG]["noop_updates_skipped"] == 0


def test_on_change_drops_no_ops_and_keeps_the_last_real_change_timestamp():
    with TopologyTestDriver(counts(Emit.on_change(), kind="latest")) as d:
        for v, ts in [(1, 10), (1, 20), (2, 30), (2, 40), (1, 50)]:
            d.pipe_input("clicks", "a", v, timestamp=ts)
        assert out(d) == [("a", 1, 10), ("a", 2, 30), ("a", 1, 50)]
        d.pipe_input("clicks", "a", 1, timestamp=60)
        assert out(d) == []
        assert d.get_store("counts").get_with_timestamp("a") == (1, 50)
        assert d.get_store("counts.emitted").get("a") == (1, 50, 0)
        m = d.metrics()[AGG]
        assert (m["records_in"], m["records_emitted"], m["noop_updates_skipped"]) == (6, 3, 3)


def test_every_on_stream_time_rate_limits_per_key_and_flushes_on_shutdown():
    with TopologyTestDriver(counts(Emit.every(100))) as d:
        d.pipe_input("clicks", "a", 0, timestamp=0)      # never emitted: goes out at once
        d.pipe_input("clicks", "a", 0, timestamp=10)     # deferred until 0 + 100
        d.pipe_input("clicks", "a", 0, timestamp=50)     # deferred, latest wins
        d.pipe_input("clicks", "b", 0, timestamp=60)     # b's first: at once
        assert out(d) == [("a", 1, 0), ("b", 1, 60)]
        d.pipe_input("clicks", "b", 0, timestamp=150)    # b deferred to 160; stream time 150 releases a
        assert out(d) == [("a", 3, 50)]
        d.pipe_input("clicks", "a", 0, timestamp=170)    # a deferred to 250; stream time 170 releases b
        assert out(d) == [("b", 2, 150)]
        assert d.get_store("counts.emitted").get("a") == (3, 50, 150)
        m = d.metrics()[AGG]
        assert (m["records_emitted"], m["emissions_deferred"]) == (4, 4)
    assert out(d) == [("a", 4, 170)]                     # the closing-time flush


def test_every_on_wall_clock_uses_the_punctuator_and_flushes_on_shutdown():
    with TopologyTestDriver(counts(Emit.every(100, clock="wall"))) as d:
        d.pipe_input("clicks", "a", 0, timestamp=1000)
        d.pipe_input("clicks", "a", 0, timestamp=1001)
        d.advance_wall_clock(50)
        d.pipe_input("clicks", "a", 0, timestamp=1002)
        assert out(d) == [("a", 1, 1000)]
        d.advance_wall_clock(50)                          # wall 100: a's interval has passed
        assert out(d) == [("a", 3, 1002)]
        d.pipe_input("clicks", "a", 0, timestamp=5000)    # stream time does not matter here
        assert out(d) == []
        d.advance_wall_clock(99)
        assert out(d) == []
    assert out(d) == [("a", 4, 5000)]


def test_every_drops_a_deferred_update_that_returns_to_the_emitted_value():
    with TopologyTestDriver(counts(Emit.every(100), kind="latest")) as d:
        d.pipe_input("clicks", "a", "x", timestamp=0)
        d.pipe_input("clicks", "a", "y", timestamp=10)    # deferred
        d.pipe_input("clicks", "a", "x", timestamp=20)    # back to what was emitted
        d.pipe_input("clicks", "b", "z", timestamp=500)   # a's deadline passes: nothing to emit
        assert out(d) == [("a", "x", 0), ("b", "z", 500)]
        m = d.metrics()[AGG]
        assert (m["emissions_deferred"], m["noop_updates_skipped"]) == (1, 1)
    assert out(d) == []


def test_every_then_on_change_is_the_same_policy():
    def run(emit):
        with TopologyTestDriver(counts(emit, kind="latest")) as d:
            for v, ts in [(1, 0), (1, 5), (2, 50), (2, 120), (1, 130), (1, 300), (3, 301)]:
                d.pipe_input("clicks", "a", v, timestamp=ts)
        return out(d)

    assert repr(Emit.every(100).on_change()) == "Emit.every(100).on_change()"
    assert (run(Emit.every(100).on_change()) == run(Emit.every(100))
            == [("a", 1, 0), ("a", 2, 50), ("a", 1, 130), ("a", 3, 301)])


def test_pending_emissions_survive_a_restart_of_the_task(tmp_path):
    """Deferred keys live in memory; a task reopened on the same RocksDB state finds them by
    comparing the value and last-emitted columns, and its flush forwards them."""
    from processor.engine.task import Task
    from processor.state.rocksdb import RocksDBDatabase

    topo = counts(Emit.every(100)).for_application("app")
    sent = []

    class Collect:
        def send(self, topic, key, value, ts, headers, partition=None):
            sent.append((key, value, ts))

    def open_task():
        return Task(topo, 0, 0, RocksDBDatabase(tmp_path / "t"), Collect(), lambda: 0, on_error="fail")

    t = open_task()
    for off, ts in enumerate([0, 10, 20]):
        t.process("clicks", 0, off, ts, b"a", b"0")
    t.commit()
    t.close()                       # not flushed: a (count 3) is still pending
    assert sent == [(b"a", b"1", 0)]
    t = open_task()
    t.flush()
    t.commit()
    t.close()
    assert sent == [(b"a", b"1", 0), (b"a", b"3", 20)]


def test_on_window_close_needs_a_windowed_aggregation():
    b = StreamsBuilder()
    with pytest.raises(TopologyError, match="needs a windowed aggregation"):
        b.stream("clicks").group_by_key().count(emit=Emit.on_window_close())


def test_emit_rejects_bad_arguments():
    with pytest.raises(ValueError):
        Emit.every(0)
    with pytest.raises(ValueError):
        Emit.every(10, clock="cpu")
    with pytest.raises(ValueError):
        Emit.on_update().on_change()
