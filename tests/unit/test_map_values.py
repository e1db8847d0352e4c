"""map_values on tables (unchanged results are not forwarded) and streams."""

from processor import StreamsBuilder
from processor.records import OutputRecord
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def test_table_map_values_drops_unchanged_results():
    b = StreamsBuilder()
    b.table("t").map_values(lambda v: v["status"], value_serde=Serdes.string()).to_stream().to("out")
    with TopologyTestDriver(b.build()) as d:
        d.pipe_input("t", "o1", {"status": "NEW", "amount": 1}, timestamp=1)
        d.pipe_input("t", "o1", {"status": "NEW", "amount": 2}, timestamp=2)   # status unchanged
        d.pipe_input("t", "o1", {"status": "PAID", "amount": 2}, timestamp=3)
        d.pipe_input("t", "o1", None, timestamp=4)
        assert d.read_output("out") == [
            OutputRecord("o1", "NEW", 1), OutputRecord("o1", "PAID", 3), OutputRecord("o1", None, 4)]
        assert d.metrics()["KTABLE-MAPVALUES-0000000001"] == {"unchanged_skipped": 1}


def test_table_map_values_then_filter_sees_mapped_changes():
    b = StreamsBuilder()
    b.table("t").map_values(lambda v: {"n": v["amount"] // 100}) \
        .filter(lambda k, v: v["n"] >= 1).to_stream().to("out")
    with TopologyTestDriver(b.build()) as d:
        for ts, amount in enumerate([50, 99, 150, 199, 250, 10], 1):
            d.pipe_input("t", "k", {"amount": amount}, timestamp=ts)
        assert d.read_output("out") == [
            OutputRecord("k", {"n": 1}, 3), OutputRecord("k", {"n": 2}, 5), OutputRecord("k", None, 6)]


def test_stream_filter_and_map_values():
    b = StreamsBuilder()
    b.stream("s").filter(lambda k, v: v % 2 == 0).map_values(lambda v: v * 10).to("out")
    with TopologyTestDriver(b.build()) as d:
        for i in range(5):
            d.pipe_input("s", f"k{i}", i, timestamp=100 + i)
        assert d.read_output("out") == [OutputRecord("k0", 0, 100), OutputRecord("k2", 20, 102),
                                        OutputRecord("k4", 40, 104)]
        assert d.metrics()["KSTREAM-FILTER-0000000001"] == {"dropped": 2}

