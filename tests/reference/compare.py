"""Runs a twin on both sides over the same steps and compares them.

``python_side(twin, params, steps)`` runs this project's ``TopologyTestDriver``; ``kafka_side``
answers come from ``kafka_streams.run_cases``. ``differences(...)`` lists what differs, per
output topic and store, after the documented divergences (``divergences.py``) have been applied
to Kafka Streams' output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.reference import divergences
from tests.reference.kafka_streams import Answer, Case
from tests.reference.twins import SERDES, Twin

Record = tuple[bytes | None, bytes | None, int, int]   # key, value, timestamp, step
_B = Serdes.bytes()


@dataclass
class PythonAnswer:
    outputs: dict[str, list[Record]]
    stores: dict[str, list[tuple[bytes, bytes]]]
    error: str | None
    dead_letters: list[tuple[int, str]]   # (step, reason) of each record this side dead-lettered


def case_of(twin: Twin, params: dict[str, Any], steps: list[tuple], case_id: str) -> Case:
    java = params if twin.java_params is None else twin.java_params(params)
    return Case(case_id, twin.name, java, steps, list(twin.outputs), list(twin.stores))


def python_side(twin: Twin, params: dict[str, Any], steps: list[tuple]) -> PythonAnswer:
    outputs: dict[str, list[Record]] = {t: [] for t in twin.outputs}
    stores: dict[str, list[tuple[bytes, bytes]]] = {}
    dead: list[tuple[int, str]] = []
    try:
        with TopologyTestDriver(twin.build(params)) as driver:
            for i, step in enumerate(steps):
                if step[0] == "advance":
                    driver.advance_wall_clock(step[1])
                else:
                    driver.pipe_raw(step[0], step[1], step[2], step[3])
                for t in twin.outputs:
                    outputs[t] += [(r.key, r.value, r.timestamp, i) for r in driver.read_output(t, _B, _B)]
                dead += [(i, dict(r.headers).get("__streams.errors.message", b"").decode())
                         for r in driver.read_output(driver.dlq_topic, _B, _B)]
            for name, ks, vs in twin.stores:
                store: Any = driver.get_store(name)
                stores[name] = sorted((SERDES[ks].serialize(k), SERDES[vs].serialize(v)) for k, v in store.items())
    except Exception as e:   # reported, compared with the Java side's
        return PythonAnswer(outputs, stores, f"{type(e).__name__}: {e}", dead)
    return PythonAnswer(outputs, stores, None, dead)


def render(rec: Record, value_serde: str) -> str:
    k, v, ts, step = rec
    key = None if k is None else k.decode("utf-8", "replace")
    value = None if v is None else SERDES[value_serde].deserialize(v)
    return f"{key}:{value}@{ts}#{step}"


def first_difference(ours: list[Record], theirs: list[Record], value_serde: str) -> str | None:
    """None if equal, else where the two lists part, with a few records of context."""
    if ours == theirs:
        return None
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    lo = max(0, i - 3)
    show = lambda rs: [render(r, value_serde) for r in rs[lo:i + 4]]   # noqa: E731
    return (f"{len(ours)} records here, {len(theirs)} in Kafka Streams; they part at #{i}:\n"
            f"    here:          {show(ours)}\n    Kafka Streams: {show(theirs)}")


def input_timestamps(steps: list[tuple]) -> list[int]:
    """Per step, its record's timestamp (a wall-clock step: the one before's)."""
    out, last = [], 0
    for s in steps:
        last = last if s[0] == "advance" else s[3]
        out.append(last)
    return out


def compare(twin: Twin, ours: PythonAnswer, theirs: Answer, steps: list[tuple],
            params: dict[str, Any] | None = None) -> list[str]:
    """Every difference between the two answers after the twin's documented divergences, one
    text each (empty: they agree)."""
    problems = []
    if (ours.error is None) != (theirs.error is None):
        problems.append(f"error here: {ours.error}; error in Kafka Streams: {theirs.error}")
        return problems
    for topic, vs in twin.outputs.items():
        rules = twin.topic_rules.get(topic, twin.rules)
        expected = divergences.apply([r for r in rules if r in divergences.RULES],
                                     theirs.outputs.get(topic, []), input_timestamps(steps))
        if "row_time" in rules:
            assert twin.row_time is not None, f"twin {twin.name} names row_time without a row_time stamp"
            expected = divergences.row_time(expected, steps, functools.partial(twin.row_time, params=params or {}))
        if "unmatched_timing" in rules:
            assert twin.unmatched is not None and twin.join_window is not None
            expected = divergences.unmatched_timing(expected, ours.outputs[topic], steps, twin.unmatched,
                                                     twin.join_window)
        if "final_results_lost" in rules:
            assert twin.window_size is not None
            expected = divergences.final_results_lost(expected, ours.outputs[topic], steps, *twin.window_size)
        d = first_difference(ours.outputs[topic], expected, vs)
        if d:
            problems.append(f"topic {topic}: {d}")
    for name, _ks, _vs in twin.stores:
        a, b = sorted(ours.stores.get(name, [])), sorted(theirs.stores.get(name, []))
        if a != b:
            problems.append(f"store {name}: here {len(a)} entries, in Kafka Streams {len(b)}; "
                            f"only here {sorted(set(a) - set(b))[:3]}, only there {sorted(set(b) - set(a))[:3]}")
    return problems
