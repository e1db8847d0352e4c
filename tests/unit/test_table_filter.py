"""KTable.filter with KAFKA-3902 semantics, through the test driver: exact output sequences."""

from hypothesis import given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.records import Change, OutputRecord
from processor.serde import Serdes
from processor.testing import TopologyTestDriver


def build(predicate=lambda k, v: v["amount"] > 100, negate=False):
    b = StreamsBuilder()
    t = b.table("orders", key_serde=Serdes.string(), value_serde=Serdes.json())
    (t.filter_not(predicate) if negate else t.filter(predicate)).to_stream().to("out")
    return b.build()


def test_four_transitions_and_both_fail_forwards_nothing():
    with TopologyTestDriver(build()) as d:
        d.pipe_input("orders", "a", {"amount": 50}, timestamp=1)    # fail (absent) -> fail: nothing
        d.pipe_input("orders", "a", {"amount": 60}, timestamp=2)    # fail -> fail: nothing
        d.pipe_input("orders", "a", {"amount": 150}, timestamp=3)   # fail -> pass: (new<-None)
        d.pipe_input("orders", "a", {"amount": 170}, timestamp=4)   # pass -> pass: (new<-old)
        d.pipe_input("orders", "a", {"amount": 20}, timestamp=5)    # pass -> fail: tombstone
        d.pipe_input("orders", "a", None, timestamp=6)              # fail -> delete: nothing
        d.pipe_input("orders", "b", {"amount": 500}, timestamp=7)   # absent -> pass
        d.pipe_input("orders", "b", None, timestamp=8)              # pass -> delete: tombstone
        d.pipe_input("orders", "c", None, timestamp=9)              # delete of absent key: nothing
        assert d.read_output("out") == [
            OutputRecord("a", {"amount": 150}, 3),
            OutputRecord("a", {"amount": 170}, 4),
            OutputRecord("a", None, 5),
            OutputRecord("b", {"amount": 500}, 7),
            OutputRecord("b", None, 8),
        ]
        m = d.metrics()
        assert m["KTABLE-FILTER-0000000001"] == {"skipped_both_fail": 3}
        assert m["KTABLE-SOURCE-0000000000"]["noop_updates_skipped"] == 1  # the delete of absent 'c'


def test_filter_forwards_change_pairs_downstream():
    """The filter's Change values themselves (what an aggregation downstream would see)."""
    seen = []
    b = StreamsBuilder()
    t = b.table("orders").filter(lambda k, v: v["amount"] > 100)
    t.map_values(lambda v: seen.append(v) or v["amount"]).to_stream().to("out")
    from processor.operators.base import Processor
    from processor.operators.filter import TableFilter

    forwarded = []

    class Spy(Processor):
        """Sits between the filter and its children: records what the filter forwards."""

        def process(self, key, change, ts):
            forwarded.append((key, change, ts))
            self.forward(key, change, ts)

    with TopologyTestDriver(b.build()) as d:
        (task,) = [t for t in d.tasks if any(type(op) is TableFilter for op in t.ops.values())]
        (flt,) = [op for op in task.ops.values() if type(op) is TableFilter]
        spy = Spy("spy")
        spy.init(flt.context)
        spy.children, flt.children = flt.children, [spy]
        for ts, v in enumerate([{"amount": 1}, {"amount": 200}, {"amount": 300}, {"amount": 5}], 1):
            d.pipe_input("orders", "k", v, timestamp=ts)
    assert forwarded == [
        ("k", Change({"amount": 200}, None), 2),
        ("k", Change({"amount": 300}, {"amount": 200}), 3),
        ("k", Change(None, {"amount": 300}), 4),
    ]
    assert repr(forwarded[2][1]) == "(None<-{'amount': 300})"


def test_filter_not_is_the_complement():
    with TopologyTestDriver(build(negate=True)) as d:
        d.pipe_input("orders", "a", {"amount": 50}, timestamp=1)
        d.pipe_input("orders", "a", {"amount": 150}, timestamp=2)
        d.pipe_input("orders", "a", {"amount": 10}, timestamp=3)
        assert d.read_output("out") == [
            OutputRecord("a", {"amount": 50}, 1),
            OutputRecord("a", None, 2),
            OutputRecord("a", {"amount": 10}, 3),
        ]


def test_predicate_error_names_record_step_and_function():
    from processor.errors import ProcessingError

    def strict(k, v):
        return v["missing"] > 0

    with TopologyTestDriver(build(strict), on_error="fail") as d:
        try:
            d.pipe_input("orders", "a", {"amount": 1}, timestamp=1)
        except ProcessingError as exc:
            msg = str(exc)
        else:
            raise AssertionError("no error")
    assert "orders[0]@0" in msg and "KTABLE-FILTER-0000000001" in msg and "strict" in msg and "KeyError" in msg


ops = st.lists(st.tuples(st.sampled_from("abcd"), st.one_of(st.none(), st.integers(0, 200))),
               max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_output_is_exactly_the_change_of_the_filtered_table(seq):
    """Oracle: after each record, the output equals the difference between the from-scratch
    filtered table before and after it (no (None<-None), no re-emission, no extra tombstones)."""
    pred = lambda k, v: v["amount"] > 100  # noqa: E731
    table: dict = {}
    with TopologyTestDriver(build(pred)) as d:
        for ts, (k, amount) in enumerate(seq):
            before = {kk: vv for kk, vv in table.items() if pred(kk, vv)}
            if amount is None:
                table.pop(k, None)
            else:
                table[k] = {"amount": amount}
            after = {kk: vv for kk, vv in table.items() if pred(kk, vv)}
            expected = [OutputRecord(k, after.get(k), ts)] if before.get(k) != after.get(k) else []
            d.pipe_input("orders", k, None if amount is None else {"amount": amount}, timestamp=ts)
            assert d.read_output("out") == expected
