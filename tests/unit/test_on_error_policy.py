"""The ``on_error`` policy over every kind of record failure, and the all-or-nothing record.

Under ``dlq`` and ``skip`` a record that fails (it does not deserialize, a user function raises,
an output does not serialize or is larger than ``message.max.bytes``) leaves nothing behind: no
store write, no output, no internal record. So a run over a history with failing records must
equal, sink by sink and store by store, a run over the same history without them (a
differential test), and the dead-letter topic must hold exactly those records, in order.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor import StreamsBuilder
from processor.engine.task import DLQ_HEADERS
from processor.errors import OutputError, UserFunctionError
from processor.testing import TopologyTestDriver

HUGE = "x" * 1_100_000     # more than librdkafka's default message.max.bytes (1,000,000)


def is_bad(topic, value) -> str | None:
    """Why a record fails in ``topology()`` (None: it does not)."""
    if not isinstance(value, dict):
        return "poison bytes"
    if topic == "items":
        if value["n"] % 7 == 0:
            return "predicate raises"
        if value["n"] % 11 == 0:
            return "output too large"
    if topic == "events" and value["x"] % 5 == 0:
        return "predicate raises"
    return None


def topology():
    b = StreamsBuilder()
    items = b.table("items", store_name="items")

    def even(k, v):
        if v["n"] % 7 == 0:
            raise ValueError(f"n={v['n']} is a multiple of 7")
        return v["n"] % 2 == 0

    def widen(v):
        return {"pad": HUGE} if v["n"] % 11 == 0 else {"n": v["n"], "g": v["g"]}

    items.filter(even).to_stream().to("even")
    items.map_values(widen).to_stream().to("wide")
    items.group_by(lambda k, v: (v["g"], v["n"])).aggregate(
        lambda: 0, lambda k, v, agg: agg + v, lambda k, v, agg: agg - v, name="sum-by-g"
    ).to_stream().to("sums")
    events = b.stream("events")
    events.filter(lambda k, v: 1 // (v["x"] % 5) >= 0).to("kept")
    events.group_by_key().count(name="count-by-user").to_stream().to("counts")
    return b.build()


SINKS = ("even", "wide", "sums", "kept", "counts")
STORES = ("items", "sum-by-g", "count-by-user")

records = st.lists(st.one_of(
    st.tuples(st.just("items"), st.sampled_from("abcde"),
              st.one_of(st.none(), st.fixed_dictionaries({"n": st.integers(0, 40), "g": st.sampled_from("xy")}))),
    st.tuples(st.just("events"), st.sampled_from("uv"), st.fixed_dictionaries({"x": st.integers(0, 20)})),
    st.tuples(st.sampled_from(["items", "events"]), st.sampled_from("abuv"), st.just(b"{not json")),
), max_size=40)


def run(history, on_error):
    """``history``: ``[(topic, key, value)]`` (timestamp = position) or ``[(ts, topic, key, value)]``."""
    with TopologyTestDriver(topology(), application_id="app", on_error=on_error) as d:
        for i, rec in enumerate(history):
            if len(rec) == 4:
                i, rec = rec[0], rec[1:]
            topic, key, value = rec
            if isinstance(value, bytes):
                d.pipe_raw(topic, key.encode(), value, timestamp=i)
            else:
                d.pipe_input(topic, key, value, timestamp=i)
        d.flush()
        outs = {s: [(r.key, r.value, r.timestamp) for r in d.read_output(s)] for s in SINKS}
        stores = {s: d.get_store(s).items() for s in STORES}
        dlq = d.read_output("app-dlq")
        metrics = d.metrics()
    return outs, stores, dlq, metrics


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_a_failed_record_leaves_nothing_behind(history):
    """dlq and skip over the whole history == fail over the history without the failing records."""
    clean = [(i, t, k, v) for i, (t, k, v) in enumerate(history) if v is None or is_bad(t, v) is None]
    bad = [(i, t, k, v) for i, (t, k, v) in enumerate(history) if v is not None and is_bad(t, v)]
    want_outs, want_stores, want_dlq, _ = run(clean, "fail")
    assert want_dlq == []
    for policy in ("dlq", "skip"):
        outs, stores, dlq, _ = run(history, policy)
        assert outs == want_outs, policy
        assert stores == want_stores, policy
        if policy == "skip":
            assert dlq == []
            continue
        # exactly the failing records, in order, with their original bytes and timestamps
        assert [(r.key, r.timestamp) for r in dlq] == [(k.encode(), i) for i, _, k, _ in bad]
        for r, (_i, topic, _, v) in zip(dlq, bad, strict=False):
            h = dict(r.headers)
            assert [n for n, _ in r.headers] == list(DLQ_HEADERS)
            assert h["__streams.errors.topic"] == topic.encode()
            why = is_bad(topic, v)
            expected = {"poison bytes": b"json.decoder.JSONDecodeError", "predicate raises":
                        (b"ValueError" if topic == "items" else b"ZeroDivisionError"),
                        "output too large": b"processor.errors.OutputError"}[why]
            assert h["__streams.errors.exception"] == expected, h


def test_dead_letter_headers_name_the_function_and_the_step():
    outs, stores, dlq, _ = run([("items", "a", {"n": 4, "g": "x"}), ("items", "a", {"n": 14, "g": "y"}),
                                      ("items", "a", {"n": 22, "g": "y"}), ("items", "a", {"n": 6, "g": "y"})],
                                     "dlq")
    assert [r.timestamp for r in dlq] == [1, 2]
    first, second = (dict(r.headers) for r in dlq)
    assert first["__streams.errors.message"].startswith(
        b"record items[0]@1, step KTABLE-FILTER-0000000001: user function "
        b"topology.<locals>.even (test_on_error_policy.py:")
    assert first["__streams.errors.message"].endswith(b"raised ValueError: n=14 is a multiple of 7")
    assert first["processor.errors.step"] == b"KTABLE-FILTER-0000000001"
    trace = first["__streams.errors.stacktrace"].decode()
    assert trace.startswith("Traceback") and "in even" in trace and trace.rstrip().endswith(
        "ValueError: n=14 is a multiple of 7")
    assert (first["__streams.errors.partition"], first["__streams.errors.offset"]) == (b"0", b"1")
    assert second["__streams.errors.message"].startswith(b"record items[0]@2, step sink to wide: an output record")
    assert b"more than the producer's message.max.bytes (1000000)" in second["__streams.errors.message"]
    # the key's value went from 4 straight to 6: what the outputs and stores say
    assert outs["even"] == [("a", {"n": 4, "g": "x"}, 0), ("a", {"n": 6, "g": "y"}, 3)]
    assert outs["wide"] == [("a", {"n": 4, "g": "x"}, 0), ("a", {"n": 6, "g": "y"}, 3)]
    assert stores["items"] == [("a", {"n": 6, "g": "y"})]
    assert stores["sum-by-g"] == [("x", 0), ("y", 6)]


def test_operator_counters_survive_the_rebuild_after_a_failed_record():
    history = [("items", "a", {"n": 2, "g": "x"}), ("items", "b", {"n": 7, "g": "x"}),
               ("items", "c", {"n": 4, "g": "x"})]
    with TopologyTestDriver(topology(), application_id="app") as d:
        for i, (t, k, v) in enumerate(history):
            d.pipe_input(t, k, v, timestamp=i)
        sinks = {name: m["records_out"] for name, m in d.metrics().items() if "records_out" in m}
    # even, wide, the repartition sink and sums each sent a (before the rebuild) and c (after it);
    # the failed b sent nothing anywhere; kept and counts saw no event
    assert sorted(sinks.values()) == [0, 0, 2, 2, 2, 2], sinks


def test_fail_policy_stops_at_the_first_failure_naming_it():
    with TopologyTestDriver(topology(), application_id="app", on_error="fail") as d:
        d.pipe_input("items", "a", {"n": 2, "g": "x"}, timestamp=0)
        with pytest.raises(UserFunctionError, match=r"record items\[0\]@1, step KTABLE-FILTER-0000000001: "
                                                    r"user function topology\.<locals>\.even") as info:
            d.pipe_input("items", "a", {"n": 21, "g": "x"}, timestamp=1)
        assert info.value.function.startswith("topology.<locals>.even (test_on_error_policy.py:")
        assert info.value.exit_code == 6
        with pytest.raises(OutputError, match=r"record items\[0\]@2, step sink to wide"):
            d.pipe_input("items", "b", {"n": 11, "g": "x"}, timestamp=2)


def test_a_user_function_failing_on_an_internal_record_dead_letters_that_record():
    """The aggregator runs behind the repartition topic: the record that fails there is the
    internal one; it is dead-lettered (named by its topic) and the aggregate does not move."""
    b = StreamsBuilder()

    def adder(k, v, agg):
        if v == 13:
            raise ArithmeticError("unlucky")
        return agg + v

    b.table("items", store_name="items").group_by(lambda k, v: (v["g"], v["n"])).aggregate(
        lambda: 0, adder, lambda k, v, agg: agg - v, name="sum-by-g").to_stream().to("sums")
    with TopologyTestDriver(b.build(), application_id="app") as d:
        for i, n in enumerate([1, 13, 2]):
            d.pipe_input("items", f"k{i}", {"n": n, "g": "x"}, timestamp=i)
        assert [(r.key, r.value) for r in d.read_output("sums")] == [("x", 1), ("x", 3)]
        dlq = d.read_output("app-dlq")
        assert len(dlq) == 1
        h = dict(dlq[0].headers)
        assert h["__streams.errors.topic"].endswith(b"-repartition") and h["__streams.errors.exception"] == \
            b"ArithmeticError"
        assert b"user function test_a_user_function_failing_on_an_internal_record_dead_letters_that_record." \
            b"<locals>.adder" in h["__streams.errors.message"]
        assert d.get_store("sum-by-g").items() == [("x", 3)]


def test_a_value_its_serde_cannot_write_follows_the_policy():
    """An aggregate whose group key the key serde cannot write (an int under Serdes.string())
    and whose value the value serde cannot write (a set under JSON): dead-lettered, not fatal."""
    from processor.serde import Serdes

    b = StreamsBuilder()
    b.table("items", store_name="items").group_by(
        lambda k, v: (v["g"], v["n"]), key_serde=Serdes.string()).aggregate(
        lambda: 0, lambda k, v, agg: {1, 2} if v == 99 else agg + v, lambda k, v, agg: agg - v,
        name="sum-by-g").to_stream().to("sums")
    with TopologyTestDriver(b.build(), application_id="app") as d:
        d.pipe_input("items", "a", {"n": 1, "g": "x"}, timestamp=0)
        d.pipe_input("items", "b", {"n": 2, "g": 7}, timestamp=1)      # group key 7: not a str
        d.pipe_input("items", "c", {"n": 99, "g": "x"}, timestamp=2)   # aggregate {1, 2}: not JSON
        d.pipe_input("items", "d", {"n": 3, "g": "x"}, timestamp=3)
        assert [(r.key, r.value) for r in d.read_output("sums")] == [("x", 1), ("x", 4)]
        dlq = [dict(r.headers) for r in d.read_output("app-dlq")]
        assert [h["__streams.errors.topic"].endswith(b"-repartition") for h in dlq] == [False, True]
        assert dlq[0]["__streams.errors.message"].endswith(   # at the repartition topic's sink
            b"key serialization with Serdes.string() for topic 'app-sum-by-g-repartition' failed: "
            b"TypeError: string serde expects str, got int")
        assert b"aggregate value {1, 2} does not serialize" in dlq[1]["__streams.errors.message"]
        assert d.get_store("items").items() == [("a", {"n": 1, "g": "x"}), ("c", {"n": 99, "g": "x"}),
                                                ("d", {"n": 3, "g": "x"})]


def test_a_dead_letter_record_over_the_limit_keeps_short_texts_or_fails_loudly():
    from processor.engine.task import _wire_size

    def loud(k, v):
        raise ValueError("too loud " * 300)   # a 2,700-byte message, in the stack trace too

    b = StreamsBuilder()
    b.table("items", store_name="items").filter(loud).to_stream().to("out")
    topo = b.build()

    def raising_run(limit):
        d = TopologyTestDriver(topo, application_id="app")
        d.tasks[0].max_record_bytes = limit
        d.pipe_input("items", "a", {"n": 1, "g": "x" * 1200}, timestamp=0)
        return d

    d = raising_run(1_000_000)
    [full] = d.read_output("app-dlq")
    d.close()
    size = _wire_size(full.key, full.value, full.headers)
    d = raising_run(size - 1)
    [short] = d.read_output("app-dlq")
    d.close()
    h, hf = dict(short.headers), dict(full.headers)
    assert len(h["__streams.errors.stacktrace"]) == 512 < len(hf["__streams.errors.stacktrace"])
    assert h["__streams.errors.message"] == hf["__streams.errors.message"][:512]
    assert (h["__streams.errors.topic"], h["__streams.errors.offset"]) == (b"items", b"0")
    assert _wire_size(short.key, short.value, short.headers) <= size - 1
    # too large even with short texts: a stub, its value cut, saying so
    d = raising_run(1500)
    [stub] = d.read_output("app-dlq")
    d.close()
    assert d.tasks[0].dead_lettered_cut == 1
    raw = dict(stub.headers)
    assert _wire_size(stub.key, stub.value, stub.headers) <= 1500
    assert raw["__streams.errors.stacktrace"] == h["__streams.errors.stacktrace"]
    assert (raw["__streams.errors.topic"], raw["__streams.errors.offset"]) == (b"items", b"0")
    value_bytes = len(full.value) if isinstance(full.value, bytes) else None
    assert raw["processor.errors.truncated"].startswith(b"key=1/1;value=")
    assert raw["processor.errors.truncated"].endswith(b"headers=0/0")
    kept, length = map(int, raw["processor.errors.truncated"].split(b";")[1][len(b"value="):].split(b"/"))
    assert 0 < kept < length and (value_bytes is None or length == value_bytes)
    # a limit that leaves no room even for the dead-letter headers: loud
    with pytest.raises(OutputError, match=r"record items\[0\]@0, step KTABLE-FILTER-0000000001: cannot "
                                          r"dead-letter this record: message.max.bytes \(1100\) leaves no room"):
        raising_run(1100)


def test_internal_records_queued_behind_the_outbox_are_size_checked_too():
    """Behind an outbox entry (a punctuation's records waiting for the commit), a record's
    internal records join the outbox instead of going out: they are checked and dropped the same."""
    from processor.engine.task import Task
    from processor.state.memory import MemoryStores

    b = StreamsBuilder()
    b.table("items", store_name="items").group_by(lambda k, v: (v["g"], HUGE if v["n"] == 11 else v["n"])) \
        .aggregate(lambda: 0, lambda k, v, agg: 0, lambda k, v, agg: 0, name="agg")
    topo = b.build().for_application("app")
    sent = []

    class Collector:
        def send(self, *r):
            sent.append(r)

    task = Task(topo, 0, 0, MemoryStores(), Collector(), lambda: 0, on_error="dlq", dlq_topic="app-dlq")
    waiting = ("app-x", b"k", b"v", 0, None, 0)
    task.context.outbox.append(waiting)
    task.process("items", 0, 0, 0, b'"a"', b'{"g": "x", "n": 1}')
    assert len(task.context.outbox) == 2                     # queued behind the waiting entry
    task.process("items", 0, 1, 1, b'"b"', b'{"g": "x", "n": 11}')
    assert len(task.context.outbox) == 2 and task.context.outbox[0] == waiting
    assert [r[0] for r in sent] == ["app-dlq"]
    assert b"more than the producer's message.max.bytes" in dict(sent[0][4])["__streams.errors.message"]
    assert task.stores.store("items").get(b'"b"') is None    # its write undone
