"""Internal records carry provenance; the receiving task drops what it has already applied."""

from processor import StreamsBuilder, provenance
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

TOPIC = "test-app-sums-repartition"


def sums():
    b = StreamsBuilder()
    b.stream("events").group_by(lambda k, v: v["g"]) \
        .aggregate(lambda: 0, lambda k, v, agg: agg + v["n"], name="sums").to_stream().to("out")
    return b.build()


def header(offset, seq, topic="events", partition=0):
    return [(provenance.HEADER, provenance.encode(topic, partition, offset, seq))]


def test_repartition_records_carry_the_provenance_of_their_input():
    with TopologyTestDriver(sums()) as d:
        d.pipe_input("events", "k1", {"g": "x", "n": 1}, timestamp=5)
        d.pipe_input("events", "k2", {"g": "y", "n": 2}, timestamp=6)
        recs = d.read_output(TOPIC, Serdes.string(), Serdes.json())
        assert [(r.key, r.value, r.timestamp) for r in recs] == [("x", {"g": "x", "n": 1}, 5),
                                                                 ("y", {"g": "y", "n": 2}, 6)]
        assert [provenance.decode(dict(r.headers)[provenance.HEADER]) for r in recs] == [
            provenance.Provenance("events", 0, 0, 0), provenance.Provenance("events", 0, 1, 0)]
        # the provenance header is internal: output topics do not get it
        assert [r.headers for r in d.read_output("out")] == [(), ()]


def test_replayed_internal_records_are_dropped_and_counted():
    with TopologyTestDriver(sums()) as d:
        v = b'{"g":"x","n":1}'
        d.pipe_raw(TOPIC, b"x", v, 1, header(5, 0))
        d.pipe_raw(TOPIC, b"x", v, 1, header(5, 1))    # a second record caused by the same input
        d.pipe_raw(TOPIC, b"x", v, 1, header(5, 1))    # replay
        d.pipe_raw(TOPIC, b"x", v, 1, header(4, 7))    # older input: replay
        d.pipe_raw(TOPIC, b"x", v, 1, header(5, 0, partition=1))  # another source partition
        d.pipe_raw(TOPIC, b"x", v, 1, header(6, 0))
        d.pipe_raw(TOPIC, b"x", v, 1)                  # no provenance (not written by a task): applied
        assert [r.value for r in d.read_output("out")] == [1, 2, 3, 4, 5]
        assert d.metrics()["task"]["duplicates_dropped"] == 2
        assert d.get_store("sums").get("x") == 5
