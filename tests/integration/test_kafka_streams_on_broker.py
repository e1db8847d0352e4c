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

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    kill_leftover_workers,
    start_worker_process,
    stop_workers,
    wait_until_group_drained,
)
from tests.integration.streams_apps import (
    close_kafka_streams,
    per_key,
    produce_steps,
    read_all,
    start_kafka_streams,
    wait_until_app_drained,
)
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


# twin -> its final output as the final input rows make it (from the steps and the twin's params)
MODELS = {"fk_join": lambda steps, params: fk_join_of_final_rows(steps, params)}


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
    produce_steps(kafka_bootstrap, prefix, steps[:before], base_ts)

    apps = {"ks": f"ref-ks-{unique}", "py": f"ref-py-{unique}"}
    java_params = {**params, "prefix": prefix, "out_prefix": outputs["ks"]}
    env = {"REFERENCE_TWIN": name, "REFERENCE_PARAMS": json.dumps({**params, "prefix": prefix,
                                                                   "out_prefix": outputs["py"]})}
    ks = start_kafka_streams(name, java_params, kafka_bootstrap, apps["ks"], tmp_path / "ks-state",
                             tmp_path / "ks.log", ks_settings)
    py = None
    try:
        py = start_worker_process(kafka_bootstrap, "tests.reference.on_broker:topology", apps["py"],
                                  tmp_path / "py-state", tmp_path / "py.log", env)
        produce_steps(kafka_bootstrap, prefix, steps[before:], base_ts)   # and after
        for who, app in apps.items():
            proc = ks if who == "ks" else py

            def alive(proc=proc, who=who):
                assert proc.poll() is None, f"{who} exited {proc.returncode}: " + (
                    tmp_path / f"{who}.log").read_text()[-3000:]
            wait_until_app_drained(kafka_bootstrap, app, inputs, check=alive)
        if py is not None:
            stop_workers([py], [tmp_path / "py.log"])
    finally:
        close_kafka_streams(ks)
        kill_leftover_workers([py] if py is not None else [])
    for t in twin.outputs:
        theirs = per_key(read_all(kafka_bootstrap, outputs["ks"] + t), kind)
        ours = per_key(read_all(kafka_bootstrap, outputs["py"] + t), kind)
        assert theirs, f"Kafka Streams wrote nothing to {t}"
        differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        assert not differing, f"{name} {t}: {len(differing)} of {len(theirs)} keys differ; " + "; ".join(
            _first_difference(k, ours.get(k), theirs.get(k)) for k in differing[:3])
        if name in MODELS:   # the result the final input rows make
            assert ours == MODELS[name](steps, params)


def fk_join_of_final_rows(steps: list[tuple], params: dict) -> dict:
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
        if right is not None or params["how"] == "left":
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
    produce_steps(kafka_bootstrap, prefix, [("right", b"d", b"7", 1)], base_ts)
    apps = {"ks": f"ref-ks-{unique}", "py": f"ref-py-{unique}"}
    params = {"how": "left", "prefix": prefix}
    ks_log = tmp_path / "ks.log"
    ks = start_kafka_streams(twin, {**params, "left_cache": False, "out_prefix": outputs["ks"]}, kafka_bootstrap,
                             apps["ks"], tmp_path / "ks-state", ks_log, {"commit.interval.ms": 600000})
    py: subprocess.Popen | None = None

    def outputs_of(who: str) -> list[bytes | None]:
        return [v for k, v, _ts, _p, _o in read_all(kafka_bootstrap, outputs[who] + "out") if k == b"a"]

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
        produce_steps(kafka_bootstrap, prefix, [("left", b"a", b"9", 2)], base_ts)   # its foreign key: "d"
        for who in ("ks", "py"):
            _wait_for(f"{who}'s first result", lambda who=who: outputs_of(who) == [b"9+7"], check=alive,
                      show=lambda who=who: outputs_of(who))
        produce_steps(kafka_bootstrap, prefix, [("right", b"d", None, 3)], base_ts)
        _wait_for("processor's result of the delete", lambda: outputs_of("py") == [b"9+7", b"9+null"], check=alive,
                  show=lambda: outputs_of("py"))
        stop_workers([py], [tmp_path / "py.log"])
    finally:
        close_kafka_streams(ks)   # Kafka Streams flushes its cache and commits as it closes
        kill_leftover_workers([py] if py is not None else [])
    assert "closed" in ks_log.read_text(), ks_log.read_text()[-3000:]
    inputs = {prefix + "left": 1, prefix + "right": 1}
    wait_until_app_drained(kafka_bootstrap, apps["ks"], inputs, timeout_s=30)
    assert fk_join_of_final_rows([("right", b"d", b"7", 1), ("left", b"a", b"9", 2), ("right", b"d", None, 3)],
                                 {"how": "left"}) == {b"a": b"9+null"}
    assert outputs_of("py") == [b"9+7", b"9+null"]
    assert outputs_of("ks") == [b"9+7"]   # D10: its last result joins a right row that is gone


def test_d11_kafka_streams_record_cache_merges_a_session_its_store_no_longer_returns(kafka_bootstrap, tmp_path, unique):
    """D11. Kafka Streams' session store finds the sessions to merge with a record through its
    record cache first (``CachingSessionStore.findSessions``), whose range is not cut at the
    store's retention by the store's clock as the store's own fetch is
    (``AbstractRocksDBSegmentedBytesStore.getActualFrom``). A session still in the cache is merged;
    the same session flushed to the store is not, so the result depends on when the cache was last
    flushed. Gap 5, grace 3 (retention 8): ``b@100``, then ``a@110`` moves the store's clock to 110,
    then ``b@104`` looks for sessions ending from 99, the store from 103. This project, and Kafka
    Streams without its cache, keep ``b@100`` and ``b@104`` apart; with its cache (flushed only at
    its close here) Kafka Streams merges them into ``b@100-104``."""
    from processor.serde import Serdes
    from processor.serde.windowed import SessionWindowedSerde
    from processor.testing import TopologyTestDriver

    twin = "session_keys_raw"
    prefix = f"ref-{unique}-"
    steps = [("in", b"b", b"1", 100), ("in", b"a", b"1", 110), ("in", b"b", b"1", 104)]
    runs = {"cache": {}, "nocache": {"statestore.cache.max.bytes": "0"}}
    kafka.create_topics(kafka_bootstrap, {prefix + "in": 1, **{f"{prefix}{run}-out": 1 for run in runs}})
    base_ts = int(time.time() * 1000) - 60_000
    produce_steps(kafka_bootstrap, prefix, steps, base_ts)
    apps = {run: f"ref-ks-{run}-{unique}" for run in runs}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for run, settings in runs.items():
            procs[run] = start_kafka_streams(twin, {"prefix": prefix, "out_prefix": f"{prefix}{run}-"},
                                             kafka_bootstrap, apps[run], tmp_path / f"{run}-state",
                                             tmp_path / f"{run}.log", {**settings, "commit.interval.ms": 600000})

        def alive():
            for run, proc in procs.items():
                assert proc.poll() is None, f"Kafka Streams ({run}) exited: " + (
                    tmp_path / f"{run}.log").read_text()[-3000:]
        for run in runs:
            _wait_for(f"Kafka Streams ({run}) to run", lambda run=run: "-> RUNNING" in (
                tmp_path / f"{run}.log").read_text(), check=alive)
        _wait_for("Kafka Streams without its cache to forward the three sessions",
                  lambda: len(read_all(kafka_bootstrap, f"{prefix}nocache-out")) == 3, check=alive)
        # the cached one forwards nothing before its close; the drain below shows it had read all
    finally:
        for proc in procs.values():
            close_kafka_streams(proc)   # the cached one flushes (and forwards) only now
    for run in runs:
        wait_until_group_drained(kafka_bootstrap, apps[run], {prefix + "in": 1}, timeout_s=30)
    serde = SessionWindowedSerde(Serdes.string())

    def sessions(records) -> dict:
        final = per_key(records, "table")
        return {str(serde.deserialize(k)): int.from_bytes(v, "big") for k, v in final.items()}
    with TopologyTestDriver(TWINS[twin].build({})) as driver:
        for _topic, k, v, ts in steps:
            driver.pipe_input("in", k.decode(), v.decode(), timestamp=base_ts + ts)
        ours = {str(r.key): r.value for r in driver.read_output("out") if r.value is not None}
    t = base_ts
    apart = {f"['b'@{t + 100}/{t + 100}]": 1, f"['a'@{t + 110}/{t + 110}]": 1, f"['b'@{t + 104}/{t + 104}]": 1}
    assert ours == apart
    assert sessions(read_all(kafka_bootstrap, f"{prefix}nocache-out")) == apart
    assert sessions(read_all(kafka_bootstrap, f"{prefix}cache-out")) == {   # D11
        f"['b'@{t + 100}/{t + 104}]": 2, f"['a'@{t + 110}/{t + 110}]": 1}
