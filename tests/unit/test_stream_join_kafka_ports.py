"""Kafka Streams' own stream-stream join tests, ported with their inputs and exact expected
outputs (``streams/src/test/java/org/apache/kafka/streams/kstream/internals/``:
``KStreamKStreamJoinTest.testWindowing``, ``KStreamKStreamLeftJoinTest.testLeftJoinDuplicates /
testLeftExpiredNonJoinedRecordsAreEmittedByTheLeftProcessor / ...ByTheRightProcessor /
testLeftJoinedRecordsWithZeroAfterAreEmitted / testOrdering / testGracePeriod``). Kafka's
tests set the outer join's emit interval to 0, which is this project's only behaviour.
Keys are Kafka Integers here too (``Serdes.integer()``), values strings."""

from processor import JoinWindows, StreamsBuilder
from processor.serde import Serdes
from processor.testing import TopologyTestDriver

KEYS = [0, 1, 2, 3]


def tostring_joiner(left, right):
    """Kafka's MockValueJoiner.TOSTRING_JOINER: ``left + "+" + right`` (null as "null")."""
    return f"{'null' if left is None else left}+{'null' if right is None else right}"


class Join:
    def __init__(self, how, windows, key_serde=None):
        b = StreamsBuilder()
        ks, vs = key_serde if key_serde is not None else Serdes.integer(), Serdes.string()
        left = b.stream("topic1", key_serde=ks, value_serde=vs)
        right = b.stream("topic2", key_serde=ks, value_serde=vs)
        getattr(left, how)(right, tostring_joiner, windows).to("out", key_serde=ks, value_serde=vs)
        self.driver = TopologyTestDriver(b.build())

    def left(self, key, value, ts):
        self.driver.pipe_input("topic1", key, value, timestamp=ts)

    def right(self, key, value, ts):
        self.driver.pipe_input("topic2", key, value, timestamp=ts)

    def results(self):
        """Kafka's ``processor.checkAndClearProcessResult``: what was forwarded since the last call."""
        return [(r.key, r.value, r.timestamp) for r in self.driver.read_output("out")]


def test_kstream_kstream_join_test_windowing():
    j = Join("join", JoinWindows.of(100))          # ofTimeDifferenceWithNoGrace(100)
    for k in KEYS[:2]:
        j.left(k, f"A{k}", 0)
    assert j.results() == []
    for k in KEYS[:2]:
        j.right(k, f"a{k}", 0)
    assert j.results() == [(0, "A0+a0", 0), (1, "A1+a1", 0)]
    for i, k in enumerate(KEYS):
        j.left(k, f"B{k}", 1000 + i)
    assert j.results() == []
    for k in KEYS:
        j.right(k, f"b{k}", 1100)
    assert j.results() == [(0, "B0+b0", 1100), (1, "B1+b1", 1100), (2, "B2+b2", 1100), (3, "B3+b3", 1100)]
    for k in KEYS:
        j.right(k, f"c{k}", 1101)
    assert j.results() == [(1, "B1+c1", 1101), (2, "B2+c2", 1101), (3, "B3+c3", 1101)]
    for k in KEYS:
        j.right(k, f"d{k}", 1102)
    assert j.results() == [(2, "B2+d2", 1102), (3, "B3+d3", 1102)]
    for k in KEYS:
        j.right(k, f"e{k}", 1103)
    assert j.results() == [(3, "B3+e3", 1103)]
    for k in KEYS:
        j.right(k, f"f{k}", 1104)
    assert j.results() == []
    for k in KEYS:                                 # before the window bound
        j.right(k, f"g{k}", 899)
    assert j.results() == []
    for k in KEYS:                                 # stream time 1104 > 900 + 100: not dropped
        j.right(k, f"h{k}", 900)
    assert j.results() == [(0, "B0+h0", 1000)]
    for k in KEYS:
        j.right(k, f"i{k}", 901)
    assert j.results() == [(0, "B0+i0", 1000), (1, "B1+i1", 1001)]
    for k in KEYS:
        j.right(k, f"j{k}", 902)
    assert j.results() == [(0, "B0+j0", 1000), (1, "B1+j1", 1001), (2, "B2+j2", 1002)]
    for k in KEYS:
        j.right(k, f"k{k}", 903)
    assert j.results() == [(0, "B0+k0", 1000), (1, "B1+k1", 1001), (2, "B2+k2", 1002), (3, "B3+k3", 1003)]
    for i, k in enumerate(KEYS):
        j.right(k, f"l{k}", 2000 + i)
    assert j.results() == []
    for k in KEYS:
        j.left(k, f"C{k}", 2100)
    assert j.results() == [(0, "C0+l0", 2100), (1, "C1+l1", 2100), (2, "C2+l2", 2100), (3, "C3+l3", 2100)]
    for k in KEYS:
        j.left(k, f"D{k}", 2101)
    assert j.results() == [(1, "D1+l1", 2101), (2, "D2+l2", 2101), (3, "D3+l3", 2101)]
    for k in KEYS:
        j.left(k, f"E{k}", 2102)
    assert j.results() == [(2, "E2+l2", 2102), (3, "E3+l3", 2102)]
    for k in KEYS:
        j.left(k, f"F{k}", 2103)
    assert j.results() == [(3, "F3+l3", 2103)]
    for k in KEYS:
        j.left(k, f"G{k}", 2104)
    assert j.results() == []
    for k in KEYS:
        j.left(k, f"H{k}", 1899)
    assert j.results() == []
    for k in KEYS:
        j.left(k, f"I{k}", 1900)
    assert j.results() == [(0, "I0+l0", 2000)]
    for k in KEYS:
        j.left(k, f"J{k}", 1901)
    assert j.results() == [(0, "J0+l0", 2000), (1, "J1+l1", 2001)]
    for k in KEYS:
        j.left(k, f"K{k}", 1902)
    assert j.results() == [(0, "K0+l0", 2000), (1, "K1+l1", 2001), (2, "K2+l2", 2002)]
    for k in KEYS:
        j.left(k, f"L{k}", 1903)
    assert j.results() == [(0, "L0+l0", 2000), (1, "L1+l1", 2001), (2, "L2+l2", 2002), (3, "L3+l3", 2003)]
    j.driver.close()


def test_the_issue_case():
    j = Join("join", JoinWindows.of(100), key_serde=Serdes.string())
    j.left("k", "B", 1000)
    j.right("x", "f", 1104)
    j.right("k", "h", 900)
    assert j.results() == [("k", "B+h", 1000)]


def test_left_join_duplicates():
    j = Join("left_join", JoinWindows.of(100).grace(10))
    j.left(0, "A0", 0)
    j.left(0, "A0-0", 0)
    j.right(1, "a0", 111)
    j.right(2, "dummy", 500)                       # bumps stream time
    assert j.results() == [(0, "A0+null", 0), (0, "A0-0+null", 0)]
    j.left(2, "A2", 1000)
    j.left(2, "A2-0", 1000)
    j.right(2, "a2", 1001)
    assert j.results() == [(2, "A2+a2", 1001), (2, "A2-0+a2", 1001)]
    j.right(3, "a3", 315)                          # A2 and A2-0 were joined: nothing more
    assert j.results() == []


def test_left_expired_non_joined_records_are_emitted_by_either_processor():
    window_start = 0
    for bump_first in ("left", "right"):
        j = Join("left_join", JoinWindows.of(100))
        j.left(0, "A0", window_start + 1)
        j.left(1, "A1", window_start + 2)
        j.left(0, "A0-0", window_start + 3)
        assert j.results() == []
        j.right(1, "a1", window_start + 3)
        assert j.results() == [(1, "A1+a1", window_start + 3)]
        getattr(j, bump_first)(2, "dummy", window_start + 401)
        assert j.results() == [(0, "A0+null", window_start + 1), (0, "A0-0+null", window_start + 3)]
        other = "right" if bump_first == "left" else "left"
        getattr(j, other)(2, "dummy", window_start + 402 if bump_first == "right" else window_start + 401)
        assert j.results() == [(2, "dummy+dummy", window_start + (402 if bump_first == "right" else 401))]


def test_left_joined_records_with_zero_after_are_emitted():
    j = Join("left_join", JoinWindows(100, 0, 0))
    for i, k in enumerate(KEYS):
        j.left(k, f"A{k}", 1000 + i)
    assert j.results() == [(0, "A0+null", 1000), (1, "A1+null", 1001), (2, "A2+null", 1002)]
    for k in KEYS:                                 # already emitted unmatched, joined all the same
        j.right(k, f"a{k}", 999)
    assert j.results() == [(0, "A0+a0", 1000), (1, "A1+a1", 1001), (2, "A2+a2", 1002), (3, "A3+a3", 1003)]
    for k in KEYS:
        j.right(k, f"b{k}", 1000)
    assert j.results() == [(0, "A0+b0", 1000), (1, "A1+b1", 1001), (2, "A2+b2", 1002), (3, "A3+b3", 1003)]
    for k in KEYS:
        j.right(k, f"c{k}", 1001)
    assert j.results() == [(1, "A1+c1", 1001), (2, "A2+c2", 1002), (3, "A3+c3", 1003)]
    for k in KEYS:
        j.right(k, f"d{k}", 1002)
    assert j.results() == [(2, "A2+d2", 1002), (3, "A3+d3", 1003)]
    for k in KEYS:
        j.right(k, f"e{k}", 1003)
    assert j.results() == [(3, "A3+e3", 1003)]
    for k in KEYS:
        j.right(k, f"f{k}", 1100)
    assert j.results() == []


def test_left_join_ordering_and_grace_period():
    j = Join("left_join", JoinWindows.of(100))
    j.left(0, "A0", 0)
    j.left(1, "A1", 100)
    assert j.results() == []
    j.right(1, "a1", 110)
    assert j.results() == [(0, "A0+null", 0), (1, "A1+a1", 110)]

    j = Join("left_join", JoinWindows.of(100).grace(10))
    for k in KEYS[:2]:
        j.left(k, f"A{k}", 0)
    assert j.results() == []
    for k in KEYS:
        j.right(k, f"a{k}", 101)
    assert j.results() == []
    j.right(0, "dummy", 1201)
    assert j.results() == [(0, "A0+null", 0), (1, "A1+null", 0)]
