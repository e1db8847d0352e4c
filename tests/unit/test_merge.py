"""KStream.merge: one sub-topology reading both topics."""

from processor import StreamsBuilder
from processor.records import OutputRecord
from processor.testing import TopologyTestDriver


def test_stream_merge_interleaves_both_inputs_in_arrival_order():
    b = StreamsBuilder()
    b.stream("a").merge(b.stream("b")).to("out")
    topo = b.build()
    assert len(topo.subtopologies) == 1
    with TopologyTestDriver(topo) as d:
        d.pipe_input("a", "k", 1, timestamp=1)
        d.pipe_input("b", "k", 2, timestamp=2)
        d.pipe_input("a", "j", 3, timestamp=3)
        assert d.read_output("out") == [OutputRecord("k", 1, 1), OutputRecord("k", 2, 2), OutputRecord("j", 3, 3)]
