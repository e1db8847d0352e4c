"""Table source: materialization, no-op suppression by bytes, timestamp of the last real change."""

from processor import StreamsBuilder
from processor.records import OutputRecord
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def topo():
    b = StreamsBuilder()
    b.table("t", key_serde=Serdes.string(), value_serde=Serdes.json(), store_name="t-store") \
        .to_stream().to("out")
    return b.build()


def test_equal_bytes_update_is_not_forwarded_and_keeps_timestamp():
    with TopologyTestDriver(topo()) as d:
        d.pipe_input("t", "k", {"x": 1, "y": 2}, timestamp=10)
        d.pipe_input("t", "k", {"y": 2, "x": 1}, timestamp=20)   # same canonical bytes: no-op
        d.pipe_input("t", "k", {"x": 2, "y": 2}, timestamp=30)
        d.pipe_input("t", "k", None, timestamp=40)
        d.pipe_input("t", "k", None, timestamp=50)                # delete of absent key: no-op
        assert d.read_output("out") == [
            OutputRecord("k", {"x": 1, "y": 2}, 10),
            OutputRecord("k", {"x": 2, "y": 2}, 30),
            OutputRecord("k", None, 40),
        ]
        assert d.metrics()["KTABLE-SOURCE-0000000000"] == {"records_in": 5, "noop_updates_skipped": 2}


def test_store_holds_value_and_last_real_change_timestamp():
    with TopologyTestDriver(topo()) as d:
        d.pipe_input("t", "a", {"v": 1}, timestamp=5)
        d.pipe_input("t", "a", {"v": 1}, timestamp=9)
        d.pipe_input("t", "b", {"v": 2}, timestamp=7)
        store = d.get_store("t-store")
        assert store.get_with_timestamp("a") == ({"v": 1}, 5)
        assert store.items() == [("a", {"v": 1}), ("b", {"v": 2})]
        assert store.get("zzz") is None


def test_stream_source_forwards_every_record():
    b = StreamsBuilder()
    b.stream("s").to("out")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("s", "k", {"v": 1}, timestamp=1)
        d.pipe_input("s", "k", {"v": 1}, timestamp=2)
        d.pipe_input("s", "k", None, timestamp=3)
        assert d.read_output("out") == [OutputRecord("k", {"v": 1}, 1), OutputRecord("k", {"v": 1}, 2),
                                        OutputRecord("k", None, 3)]
