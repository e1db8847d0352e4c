"""The test driver's contract and the poison-record policies (dlq / skip / fail)."""

import pytest

from processor import StreamsBuilder
from processor.engine.task import DLQ_HEADERS
from processor.errors import ConfigError, DeserializationError
from processor.records import OutputRecord
from processor.testing import TopologyTestDriver


def topo():
    b = StreamsBuilder()
    b.table("t", store_name="t-store").filter(lambda k, v: v > 0).to_stream().to("out")
    return b.build()


def test_dlq_policy_sends_original_bytes_with_provenance_and_goes_on():
    with TopologyTestDriver(topo(), application_id="app") as d:
        d.pipe_input("t", "a", 1, timestamp=1)
        d.pipe_raw("t", b"b", b"not json", timestamp=2, headers=[("trace", b"x1")])
        d.pipe_input("t", "c", 3, timestamp=3)
        assert d.read_output("out") == [OutputRecord("a", 1, 1), OutputRecord("c", 3, 3)]
        dlq = d.read_output("app-dlq")
        assert len(dlq) == 1
        rec = dlq[0]
        assert (rec.key, rec.value, rec.timestamp) == (b"b", b"not json", 2)
        h = dict(rec.headers)
        assert h["trace"] == b"x1"
        assert [n for n, _ in rec.headers] == ["trace", *DLQ_HEADERS]   # the input's own headers first
        assert (h["__streams.errors.topic"], h["__streams.errors.partition"],
                h["__streams.errors.offset"]) == (b"t", b"0", b"1")
        assert h["processor.errors.step"] == b"KTABLE-SOURCE-0000000000"
        assert h["__streams.errors.exception"] == b"json.decoder.JSONDecodeError"
        assert h["__streams.errors.message"].startswith(b"record t[0]@1, step KTABLE-SOURCE-0000000000: ")
        assert b"Traceback" in h["__streams.errors.stacktrace"]
        assert b"JSONDecodeError" in h["__streams.errors.stacktrace"]
        assert d.get_store("t-store").items() == [("a", 1), ("c", 3)]
        assert d.metrics()["task"]["dead_lettered"] == 1


def test_skip_policy_counts():
    with TopologyTestDriver(topo(), on_error="skip") as d:
        d.pipe_raw("t", b"b", b"{", timestamp=2)
        d.pipe_input("t", "c", 3, timestamp=3)
        assert d.read_output("out") == [OutputRecord("c", 3, 3)]
        assert d.metrics()["task"]["skipped_poison"] == 1


def test_fail_policy_raises():
    with TopologyTestDriver(topo(), on_error="fail") as d:
        with pytest.raises(DeserializationError, match=r"t\[0\]@0"):
            d.pipe_raw("t", b"b", b"{", timestamp=2)


def test_null_key_on_a_table_is_poison():
    with TopologyTestDriver(topo(), application_id="app") as d:
        d.pipe_raw("t", None, b"1", timestamp=2)
        assert d.read_output("out") == []
        assert [r.value for r in d.read_output("app-dlq")] == [b"1"]


def test_driver_rejects_unknown_topics_and_stores():
    with TopologyTestDriver(topo()) as d:
        with pytest.raises(ConfigError, match="not a source"):
            d.pipe_input("nope", "k", 1)
        with pytest.raises(ConfigError, match="not written"):
            d.read_output("nope")
        with pytest.raises(ConfigError, match="no store"):
            d.get_store("nope")


def test_read_output_drains_and_wall_clock_stamps_untimed_input():
    with TopologyTestDriver(topo(), initial_wall_clock_ms=1000) as d:
        d.advance_wall_clock(500)
        d.pipe_input("t", "a", 1)
        assert d.read_output("out") == [OutputRecord("a", 1, 1500)]
        assert d.read_output("out") == []
