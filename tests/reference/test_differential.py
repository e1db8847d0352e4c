"""This project against Kafka Streams itself: every twin of ``twins.py`` and ``java/Twins.java``
runs on the same inputs in both ``TopologyTestDriver``s, and the outputs must be equal record by
record (key, value bytes, timestamp, and the input record that caused each), with the final
stores, once the documented divergences (``divergences.py``, docs/reference.md) are applied to
Kafka Streams' side. A difference no rule explains fails, shrunk to a small input.

- ``test_random_inputs``: 20 seeds x 1,000 input records per twin and parameter set.
- ``test_small_inputs``: hypothesis' inputs of up to 40 records, shrunk by hypothesis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.serde import Serdes
from tests.reference.compare import case_of, compare, python_side, render
from tests.reference.inputs import KEYS, encoded, generate
from tests.reference.kafka_streams import Reference
from tests.reference.twins import TWINS, Twin

SEEDS = range(20)
RECORDS = 1000
CASES = [(name, params) for name, twin in TWINS.items() for params in twin.params]
IDS = [name + "".join(f"-{v}" for v in params.values()) for name, params in CASES]
_S = Serdes.string()


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    ref = Reference()
    yield ref
    ref.close()


@pytest.fixture(autouse=True)
def _quiet_dead_letters():
    # a null-key table record is dead-lettered here (docs/reference.md), one log line each
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def differences(reference: Reference, twin: Twin, params: dict, steps: list[tuple]) -> list[str]:
    theirs = reference.run([case_of(twin, params, steps, "x")])["x"]
    return compare(twin, python_side(twin, params, steps), theirs, steps, params)


def shrink(reference: Reference, twin: Twin, params: dict, steps: list[tuple], budget: int = 400) -> list[tuple]:
    """A smaller input that still differs (delta debugging: drop chunks, halving their size)."""
    chunk = len(steps) // 2
    while chunk >= 1 and budget > 0:
        i, removed = 0, False
        while i < len(steps) and budget > 0:
            trial = steps[:i] + steps[i + chunk:]
            budget -= 1
            if trial and differences(reference, twin, params, trial):
                steps, removed = trial, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return steps


def show_steps(steps: list[tuple]) -> str:
    return "\n".join(f"    #{i} " + (f"wall clock +{s[1]} ms" if s[0] == "advance" else
                                      f"{s[0]} {render((s[1], s[2], s[3], i), 'string')}")
                     for i, s in enumerate(steps))


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_random_inputs(reference, name, params):
    twin = TWINS[name]
    inputs = {seed: encoded(generate(twin.inputs, seed, RECORDS), twin.input_serdes) for seed in SEEDS}
    answers = reference.run([case_of(twin, params, steps, str(seed)) for seed, steps in inputs.items()])
    compared: dict[str, int] = dict.fromkeys(twin.outputs, 0)
    for seed, steps in inputs.items():
        ours = python_side(twin, params, steps)
        problems = compare(twin, ours, answers[str(seed)], steps, params)
        if problems:
            small = shrink(reference, twin, params, steps)
            pytest.fail(f"{name} {params}, seed {seed}: this project and Kafka Streams {len(problems)} difference(s):\n"
                        + "\n".join(problems) + f"\nshrunk to {len(small)} input records:\n{show_steps(small)}\n"
                        + "\n".join(differences(reference, twin, params, small)))
        for topic in twin.outputs:
            compared[topic] += len(ours.outputs[topic])
        # Kafka Streams drops a table record without a key; this project dead-letters it (D6):
        # any other dead letter is a record Kafka Streams processed and this project did not
        unexpected = [(i, why) for i, why in ours.dead_letters if "a table record needs a non-null key" not in why]
        assert not unexpected, f"{name} {params}, seed {seed}: dead-lettered here only: {unexpected[:3]}"
    # every output saw records: equal empty lists would prove nothing
    assert all(n > 0 for n in compared.values()), compared


_KEY = st.one_of(st.none(), st.sampled_from(KEYS[:3])).map(lambda k: None if k is None else _S.serialize(k))
_VALUE = st.one_of(st.none(), st.integers(0, 9).map(lambda v: _S.serialize(str(v))))


def _steps(twin: Twin) -> st.SearchStrategy:
    record = st.tuples(st.sampled_from(twin.inputs), _KEY, _VALUE, st.integers(0, 80))
    advance = st.tuples(st.just("advance"), st.sampled_from([10, 1000]))
    return st.lists(st.one_of(record, record, record, advance), min_size=1, max_size=40)


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_small_inputs(reference, name, params):
    twin = TWINS[name]

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(_steps(twin))
    def agree(steps):
        steps = encoded(steps, twin.input_serdes)
        problems = differences(reference, twin, params, steps)
        assert not problems, f"{name} {params}:\n{show_steps(steps)}\n" + "\n".join(problems)

    agree()


def test_d7_kafka_streams_self_join_rewrite_drops_a_pair_its_plain_join_keeps(reference):
    """D7: Kafka Streams 4.4's rewritten self-join (``KStreamKStreamSelfJoin``) joins a record
    with itself only if ``ts > stream time - retention + 1``; its plain join, and this project's
    join with and without the rewrite, join it while ``ts >= stream time - retention + 1``."""
    twin = TWINS["stream_self_join"]
    steps = [("in", b"e", b"3", 1213), ("in", b"a", b"4", 1189)]   # retention 10 + 10 + 5: 1213 - 25 + 1
    kafka = {opt: reference.run([case_of(twin, {"optimize": opt}, steps, "x").with_params({"optimize": opt})])["x"]
             for opt in (True, False)}
    ours = {opt: python_side(twin, {"optimize": opt}, steps).outputs["out"] for opt in (True, False)}
    both = [(b"e", b"3+3", 1213, 0), (b"a", b"4+4", 1189, 1)]
    assert kafka[False].outputs["out"] == both
    assert kafka[True].outputs["out"] == both[:1]
    assert ours[True] == ours[False] == both


def test_d12_emit_every_is_a_rate_limit_where_kafka_streams_suppresses(reference):
    """D12: ``Emit.every(10)`` against its nearest Kafka Streams counterpart,
    ``suppress(Suppressed.untilTimeLimit(10 ms, unbounded))``. Kafka Streams buffers a key's first
    update and forwards the key's latest value once stream time reaches that update's time + 10
    (``KTableSuppressProcessor``: a buffered key keeps its first buffer time). This project
    forwards an update after a quiet interval at once, and holds later ones until the interval
    since that emission has passed (the latest value wins)."""
    from processor import Emit, StreamsBuilder

    def every(p):
        b = StreamsBuilder()
        b.stream("in", key_serde=Serdes.string(), value_serde=Serdes.string()).group_by_key().count(
            emit=Emit.every(10), value_serde=Serdes.long()).to_stream().to("out", Serdes.string(), Serdes.long())
        return b.build()
    twin = Twin("stream_count_suppressed", every, ["in"], {"out": "long"})
    steps = [("in", b"a", b"1", 0), ("in", b"a", b"1", 3), ("in", b"b", b"1", 5), ("in", b"a", b"1", 12),
             ("in", b"b", b"1", 14), ("in", b"c", b"1", 30)]
    kafka = reference.run([case_of(twin, {}, steps, "x")])["x"].outputs["out"]
    ours = python_side(twin, {}, steps).outputs["out"]
    long = Serdes.long().serialize
    # (key, count, timestamp, the input step that caused it). Kafka Streams: a's first update (0)
    # is held until stream time reaches 10 (a@12, which it includes), b's (5) until 15 (c@30);
    # c's is still held at the end. Here: a, b and c at once; a@3 held until a@12 is 10 past a's
    # emission; b@14 held until c@30's punctuation.
    assert kafka == [(b"a", long(3), 12, 3), (b"b", long(2), 14, 5)]
    assert ours == [(b"a", long(1), 0, 0), (b"b", long(1), 5, 2), (b"a", long(3), 12, 3),
                    (b"c", long(1), 30, 5), (b"b", long(2), 14, 5)]
