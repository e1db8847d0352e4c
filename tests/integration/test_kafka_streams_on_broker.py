"""This project and Kafka Streams itself on one broker: a real Kafka Streams 4.4 application (the
Java twin, ``tests/reference/java/StreamsApp.java``) and ``processor run`` of the Python twin
read the same input topics and write their own output topics; once both groups have committed
every input and internal partition to its end, their outputs must agree per key.

The subset the differential suite cannot show in a driver: a repartitioning aggregation, a
windowed aggregate, a stream-table join over a backlog (time order across partitions) and the
foreign-key join (its round trip through two internal topics). Inputs as users produce them:
Java's murmur2 partitioner, 4 partitions, half of the records before both applications start
and half after (the stream-table join: all before, a backlog; see ``RUNS``), timestamps near now
(the broker's time-based retention keeps them).

Compared per key: a table's final value (Kafka Streams forwards every update, this project only
changes: the final values are equal whatever the divergences D1-D4); a stream's records as a
sorted list of (value, timestamp). The foreign-key join's final values must also be the join of
the final left and right rows.

D10, pinned here: Kafka Streams with its record cache can keep a foreign-key join result for a
right row that was deleted (``test_d10_...``); the foreign-key run therefore turns the cache off.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import Producer

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    kill_leftover_workers,
    start_worker_process,
    stop_workers,
    wait_until_group_drained,
)
from tests.reference import kafka_streams
from tests.reference.inputs import generate
from tests.reference.twins import TWINS, join, letter

PARTITIONS = 4
RECORDS = 3000

# (twin, params, what its output is, the share of the input produced before both start,
#  Kafka Streams settings)
RUNS = [
    ("stream_select_key_count", {}, "table", 0.5, {}),
    ("tumbling_count", {}, "table", 0.5, {}),
    # all before: live, which row a record meets depends on when each side's records are fetched
    ("stream_table_join", {"how": "left"}, "stream", 1.0, {}),
    # Kafka Streams' record cache off: with it, D10 (below) makes its result depend on timing
    ("fk_join", {"how": "left"}, "table", 0.5, {"statestore.cache.max.bytes": "0"}),
]


def _produce(bootstrap: str, prefix: str, steps: list[tuple], base_ts: int) -> None:
    p = Producer({**kafka.producer_defaults(bootstrap), "partitioner": "murmur2_random"})
    for s in steps:
        if s[0] != "advance":
            p.produce(prefix + s[0], key=s[1], value=s[2], timestamp=base_ts + s[3])
    assert p.flush(60) == 0


def _read_all(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, int, int, int]]:
    """Every record of ``topic``: (key, value, timestamp, partition, offset)."""
    return [(m.key(), m.value(), m.timestamp()[1], m.partition(), m.offset())
            for m in kafka.read_topic(bootstrap, topic, isolation_level="read_uncommitted")]


def _internal_topics(bootstrap: str, app: str) -> dict[str, int]:
    """The topics an application reads besides its inputs: repartition and foreign-key join topics."""
    md = kafka.admin(bootstrap).list_topics(timeout=10)
    return {t: len(m.partitions) for t, m in md.topics.items()
            if t.startswith(app + "-") and (t.endswith("-repartition") or t.endswith("-topic"))}


def _per_key(records, kind: str) -> dict:
    if kind == "table":   # the last record of each key (a key lives in one partition)
        last: dict = {}
        for k, v, _ts, _p, _o in sorted(records, key=lambda r: (r[3], r[4])):
            last[k] = v
        return {k: v for k, v in last.items() if v is not None}
    per: dict = {}
    for k, v, ts, _p, _o in records:
        per.setdefault(k, []).append((v, ts))
    return {k: sorted(vs, key=lambda x: (x[1], x[0] or b"")) for k, vs in per.items()}


@pytest.mark.parametrize(("name", "params", "kind", "backlog", "ks_settings"), RUNS, ids=[r[0] for r in RUNS])
def test_kafka_streams_and_processor_agree_on_the_broker(kafka_bootstrap, tmp_path, unique, name, params, kind,
                                                         backlog, ks_settings):
    twin = TWINS[name]
    prefix = f"ref-{unique}-"
    inputs = {prefix + t: PARTITIONS for t in twin.inputs}
    outputs = {"ks": f"{prefix}ks-", "py": f"{prefix}py-"}
    kafka.create_topics(kafka_bootstrap,
                        {**inputs, **{o + t: PARTITIONS for o in outputs.values() for t in twin.outputs}})
    steps = [s for s in generate(twin.inputs, seed=7, n=RECORDS, null_keys=False) if s[0] != "advance"]
    if kind == "stream":
        # no equal timestamps across the two topics: their order is one neither side defines
        # (Kafka Streams: its heap of partition heads; here: by topic name, as the backfill)
        steps = [(t, k, v, 2 * ts + (t == "left")) for t, k, v, ts in steps]
    before = int(len(steps) * backlog)
    base_ts = int(time.time() * 1000) - 600_000
    _produce(kafka_bootstrap, prefix, steps[:before], base_ts)

    apps = {"ks": f"ref-ks-{unique}", "py": f"ref-py-{unique}"}
    java_params = {**params, "prefix": prefix, "out_prefix": outputs["ks"]}
    env = {"REFERENCE_TWIN": name, "REFERENCE_PARAMS": json.dumps({**params, "prefix": prefix,
                                                                   "out_prefix": outputs["py"]})}
    with open(tmp_path / "ks.log", "w") as ks_log:
        ks = subprocess.Popen(kafka_streams.java_command("StreamsApp", name, json.dumps(java_params), kafka_bootstrap,
                                                         apps["ks"], str(tmp_path / "ks-state"),
                                                         *[f"{k}={v}" for k, v in ks_settings.items()]),
                              stdin=subprocess.PIPE, stdout=ks_log, stderr=subprocess.STDOUT)
    py = None
    try:
        py = start_worker_process(kafka_bootstrap, "tests.reference.on_broker:topology", apps["py"],
                                  tmp_path / "py-state", tmp_path / "py.log", env)
        _produce(kafka_bootstrap, prefix, steps[before:], base_ts)   # and after
        for who, app in apps.items():
            proc = ks if who == "ks" else py

            def alive(proc=proc, who=who):
                assert proc.poll() is None, f"{who} exited {proc.returncode}: " + (
                    tmp_path / f"{who}.log").read_text()[-3000:]
            wait_until_group_drained(kafka_bootstrap, app, inputs, timeout_s=180, check=alive)
            wait_until_group_drained(kafka_bootstrap, app, {**inputs, **_internal_topics(kafka_bootstrap, app)},
                                     timeout_s=180, check=alive)
        if py is not None:
            stop_workers([py], [tmp_path / "py.log"])
    finally:
        if ks.stdin:
            ks.stdin.close()
        try:
            ks.wait(60)
        except subprocess.TimeoutExpired:
            ks.kill()
            ks.wait()
        kill_leftover_workers([py] if py is not None else [])
    for t in twin.outputs:
        theirs = _per_key(_read_all(kafka_bootstrap, outputs["ks"] + t), kind)
        ours = _per_key(_read_all(kafka_bootstrap, outputs["py"] + t), kind)
        assert theirs, f"Kafka Streams wrote nothing to {t}"
        differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        assert not differing, f"{name} {t}: {len(differing)} of {len(theirs)} keys differ; " + "; ".join(
            _first_difference(k, ours.get(k), theirs.get(k)) for k in differing[:3])
        if name == "fk_join":
            assert ours == _fk_join_of_final_rows(steps, params["how"])


def _fk_join_of_final_rows(steps: list[tuple], how: str) -> dict:
    """The foreign-key join's result table as the final rows make it (a table holds the last
    record of each key in offset order: the steps' order within a key)."""
    rows: dict[str, dict] = {"left": {}, "right": {}}
    for topic, k, v, _ts in steps:
        rows[topic][k] = v
    result = {}
    for k, v in rows["left"].items():
        if v is None:
            continue
        right = rows["right"].get(letter(v.decode()).encode())
        if right is not None or how == "left":
            result[k] = join(v.decode(), None if right is None else right.decode()).encode()
    return result


def _first_difference(key, ours, theirs) -> str:
    if not isinstance(ours, list) or not isinstance(theirs, list):
        return f"{key!r}: here {ours!r}, in Kafka Streams {theirs!r}"
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return (f"{key!r}: {len(ours)} records here, {len(theirs)} in Kafka Streams, from #{i}: "
            f"here {ours[i:i + 3]}, in Kafka Streams {theirs[i:i + 3]}")


def _wait_for(what: str, condition, timeout_s: float = 60, check=None, show=None) -> None:
    """Polls ``condition()``; fails after ``timeout_s`` naming ``what`` and ``show()``, at once if
    ``check()`` fails."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if check is not None:
            check()
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}" + (f"; now: {show()}" if show else "")
        time.sleep(0.2)


def test_d10_kafka_streams_record_cache_keeps_a_foreign_key_result_of_a_deleted_right_row(kafka_bootstrap, tmp_path,
                                                                                         unique):
    """D10. A right row created and deleted between two flushes of Kafka Streams' record cache is
    never forwarded: at the flush its new value is null and the store below the cache has none,
    so ``CachingKeyValueStore.putAndMaybeForward`` skips it. But a subscription that arrived in
    between read the row through the cache (``SubscriptionJoinProcessorSupplier``: the right
    table's value getter), and its result stays: ``9+7`` for a left row whose right row is gone.
    This project has no such cache: the delete reaches every subscriber, the result is ``9+null``.

    Deterministic: Kafka Streams commits (and flushes) only at its close here, the left table has
    no cache (so the subscription leaves at once) and the right row is in the backlog before it
    starts; each step waits for both applications' output before the next."""
    twin = "fk_join"
    prefix = f"ref-{unique}-"
    outputs = {"ks": f"{prefix}ks-", "py": f"{prefix}py-"}
    kafka.create_topics(kafka_bootstrap, {prefix + "left": 1, prefix + "right": 1, outputs["ks"] + "out": 1,
                                          outputs["py"] + "out": 1})
    base_ts = int(time.time() * 1000) - 60_000
    _produce(kafka_bootstrap, prefix, [("right", b"d", b"7", 1)], base_ts)
    apps = {"ks": f"ref-ks-{unique}", "py": f"ref-py-{unique}"}
    params = {"how": "left", "prefix": prefix}
    ks_log = tmp_path / "ks.log"
    with open(ks_log, "w") as log:
        ks = subprocess.Popen(kafka_streams.java_command(
            "StreamsApp", twin, json.dumps({**params, "left_cache": False, "out_prefix": outputs["ks"]}),
            kafka_bootstrap, apps["ks"], str(tmp_path / "ks-state"), "commit.interval.ms=600000"),
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    py: subprocess.Popen | None = None

    def outputs_of(who: str) -> list[bytes | None]:
        return [v for k, v, _ts, _p, _o in _read_all(kafka_bootstrap, outputs[who] + "out") if k == b"a"]

    def alive():
        assert ks.poll() is None, f"Kafka Streams exited {ks.returncode}: " + ks_log.read_text()[-3000:]
        assert py is None or py.poll() is None, f"processor exited {py.poll()}: " + (
            tmp_path / "py.log").read_text()[-3000:]
    try:
        py = start_worker_process(kafka_bootstrap, "tests.reference.on_broker:topology", apps["py"],
                                  tmp_path / "py-state", tmp_path / "py.log",
                                  {"REFERENCE_TWIN": twin,
                                   "REFERENCE_PARAMS": json.dumps({**params, "out_prefix": outputs["py"]})})
        _wait_for("Kafka Streams to run", lambda: "-> RUNNING" in ks_log.read_text(), check=alive)
        _produce(kafka_bootstrap, prefix, [("left", b"a", b"9", 2)], base_ts)   # its foreign key: "d"
        for who in ("ks", "py"):
            _wait_for(f"{who}'s first result", lambda who=who: outputs_of(who) == [b"9+7"], check=alive,
                      show=lambda who=who: outputs_of(who))
        _produce(kafka_bootstrap, prefix, [("right", b"d", None, 3)], base_ts)
        _wait_for("processor's result of the delete", lambda: outputs_of("py") == [b"9+7", b"9+null"], check=alive,
                  show=lambda: outputs_of("py"))
        stop_workers([py], [tmp_path / "py.log"])
    finally:
        if ks.stdin:
            ks.stdin.close()   # Kafka Streams flushes its cache and commits as it closes
        try:
            ks.wait(60)
        except subprocess.TimeoutExpired:
            ks.kill()
            ks.wait()
        kill_leftover_workers([py] if py is not None else [])
    assert "closed" in ks_log.read_text(), ks_log.read_text()[-3000:]
    inputs = {prefix + "left": 1, prefix + "right": 1}
    wait_until_group_drained(kafka_bootstrap, apps["ks"], {**inputs, **_internal_topics(kafka_bootstrap, apps["ks"])},
                             timeout_s=30)
    assert _fk_join_of_final_rows([("right", b"d", b"7", 1), ("left", b"a", b"9", 2), ("right", b"d", None, 3)],
                                  "left") == {b"a": b"9+null"}
    assert outputs_of("py") == [b"9+7", b"9+null"]
    assert outputs_of("ks") == [b"9+7"]   # D10: its last result joins a right row that is gone
