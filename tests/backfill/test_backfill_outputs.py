"""What a backfill writes besides stores (issue 13 items 8 and 9), on the real broker and a real
local Spark, compared with ``TopologyTestDriver`` fed the same records in timestamp order (the
order a backfill task merges its inputs) and with a live ``Worker``:

- ``--emit-outputs`` (the command, as a subprocess): each sink receives the history's result
  once. A table's sink (``table.filter(...).to_stream().to(t)``) and an aggregate's sink receive
  their final table: exactly the driver's last record per key, a tombstone only for a key the
  topic held before (records produced there first); a stream sink (``stream.filter(...).to(t)``)
  exactly the driver's records, in order per key. Nothing goes to the dead-letter topic. The stores equal the driver's.
- Without it (``backfill.run``, the default) every sink stays empty.
- Poison records (values that are not JSON, a value that is not UTF-8, a key that is not UTF-8,
  a table record with a null key) under the default on-error policy: the backfill sends exactly
  those records, once, to ``<application-id>-dlq`` with the original headers plus
  KIP-1034's ``__streams.errors.*`` and ``processor.errors.step``, the same records a live worker over the same
  topics sends to its own dead-letter topic; the stores equal the driver's and the worker's.
  Under ``skip`` nothing is dead-lettered; under ``fail`` the command stops as ``processor run``
  does (exit 6, the record's error as one line) and leaves nothing behind."""

import json
import random
import re
import uuid

import pytest

import backfill
import backfill.job
from processor.engine.task import DLQ_HEADERS
from processor.errors import ProcessorError
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.backfill import apps
from tests.backfill.helpers import backfill_argv, contract_column_families, produce, run_cli, without_application_id
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import committed_offsets, key_partition

PARTS = 3
T0 = 1_000_000


def _js(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True).encode()


def _produce_history(bootstrap, topics: dict, history) -> list[tuple]:
    """Produce ``[(name, key, value, headers)]``, record ``i`` at ``T0 + i``, each to the
    partition murmur2 (the default partitioner) gives its key (partition 1 for a null key).
    Returns, in history order, ``(topic, partition, offset, key, value, ts, headers)``."""
    recs = {name: [] for name in topics}
    for i, (name, k, v, hs) in enumerate(history):
        recs[name].append((i, (1 if k is None else key_partition(k, PARTS), k, v, T0 + i, hs)))
    placed = {}
    for name, rs in recs.items():
        if not rs:
            continue
        rows = produce(bootstrap, topics[name], [r for _, r in rs], chunks=2)
        # rows: (topic, partition, offset, key, value, ts µs, type, headers) in (partition, offset)
        # order; match them back to history positions by (partition, timestamp)
        by_pt = {(r[1], r[5] // 1000): r for r in rows}
        for i, (p, k, v, ts, hs) in rs:
            r = by_pt[(p, ts)]
            placed[i] = (topics[name], p, r[2], k, v, ts, hs)
    return [placed[i] for i in range(len(history))]


def _driver(topology, topics, history, outputs=()):
    """The driver over the history in timestamp order: ``(stores {name: sorted [(key, value)]},
    {output topic: [(key, value, ts, headers)]}, dead-letter records)``, bytes throughout."""
    with TopologyTestDriver(topology, application_id="drv") as d:
        for i, (name, k, v, hs) in enumerate(history):
            d.pipe_raw(topics[name], k, v, timestamp=T0 + i, headers=hs)
        d.flush()
        stores = {}
        for t in d.tasks:
            for spec in t.store_specs:
                stores.setdefault(spec.name, {}).update(t.stores.store(spec.name).items())
        raw = Serdes.bytes()
        outs = {o: [(r.key, r.value, r.timestamp, tuple(r.headers)) for r in d.read_output(o, raw, raw)]
                for o in outputs}
        dlq = [(r.key, r.value, r.timestamp, tuple(r.headers)) for r in d.read_output(d.dlq_topic, raw, raw)]
    return {n: sorted(v.items()) for n, v in stores.items()}, outs, dlq


BOOKKEEPING = "_bookkeeping"


def _merged(state_dir, app) -> dict[str, list]:
    """Every contract column family of the application's task databases but the task's
    ``_bookkeeping``, merged over tasks (for a comparison with the one-task-per-sub-topology
    driver; the application id in keys and values replaced by a placeholder). Bookkeeping is
    per task (high-water marks per source partition, an aggregate's stream time), so it cannot
    equal the driver's on several partitions: it is compared task by task with a live worker."""
    out: dict[str, dict] = {}
    for cfs in without_application_id(contract_column_families(state_dir, app), app).values():
        for cf, items in cfs.items():
            if cf != BOOKKEEPING:
                out.setdefault(cf, {}).update(items)
    return {n: sorted(v.items()) for n, v in out.items()}


def _messages(bootstrap, topic) -> list[tuple]:
    """``(key, value, timestamp, headers)`` of every record of ``topic`` (partition, offset order)."""
    return [(m.key(), m.value(), m.timestamp()[1], tuple(m.headers() or ()))
            for m in kafka.read_topic(bootstrap, topic)]


def _last_per_key(records) -> list[tuple]:
    last = {}
    for r in records:
        last[r[0]] = r
    return [last[k] for k in sorted(last)]


def _per_key(records) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(r[0], []).append(r)
    return out


# -- outputs -------------------------------------------------------------------------------------------
def _sinks_history(seed):
    rnd = random.Random(seed)
    out = []
    for _ in range(3500):
        if rnd.random() < 0.6:
            k = f"i{rnd.randrange(150):03d}".encode()
            v = None if rnd.random() < 0.1 else _js({"n": rnd.randrange(30), "g": f"g{rnd.randrange(5)}"})
            out.append(("items", k, v, None))
        else:
            out.append(("events", f"u{rnd.randrange(40):02d}".encode(), _js({"x": rnd.randrange(50)}), None))
    return out


@pytest.fixture(scope="module")
def sinks_input(kafka_bootstrap):
    tag = uuid.uuid4().hex[:8]
    topics = {"items": f"bfo-items-{tag}", "events": f"bfo-events-{tag}"}
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics.values()})
    history = _sinks_history(seed=21)
    _produce_history(kafka_bootstrap, topics, history)
    return topics, history


def _sink_topics(bootstrap, topics, tag):
    t = dict(topics, out_table=f"bfo-table-{tag}", out_stream=f"bfo-stream-{tag}", out_sum=f"bfo-sum-{tag}",
             out_count=f"bfo-count-{tag}")
    kafka.create_topics(bootstrap, {t[o]: PARTS for o in ("out_table", "out_stream", "out_sum", "out_count")})
    return t


@pytest.mark.integration
@pytest.mark.parametrize("item_bytes", [None, 2048], ids=["outputs-in-one-item", "outputs-in-many-items"])
def test_emit_outputs_writes_each_sinks_history_once(sinks_input, kafka_bootstrap, tmp_path, unique, report,
                                                     item_bytes):
    # (with 2 KiB items a task run's outputs come in many items: on a local master each is a file
    # of its own, backfill/passage.py)
    topics, history = sinks_input
    t = _sink_topics(kafka_bootstrap, topics, unique)
    topo = apps.sinks_for(t)
    outs = [t["out_table"], t["out_stream"], t["out_sum"], t["out_count"]]
    want_stores, want_out, want_dlq = _driver(topo, topics, history, outs)
    assert want_dlq == []
    # the table sink already holds 3 keys the history ends (a tombstone is owed), 3 it ends with
    # a value, 1 it never writes; the other sinks are empty
    last = _last_per_key(want_out[t["out_table"]])
    tombstoned = [r for r in last if r[1] is None]
    assert len(tombstoned) > 6, "the history must end some keys of the table sink with a tombstone"
    held = [r[0] for r in tombstoned[:3]] + [r[0] for r in last if r[1] is not None][:3] + [b"never"]
    pre = [(t["out_table"], key_partition(k, PARTS), k, b'{"n": -1}', T0 - 1000, None) for k in held]
    produce(kafka_bootstrap, t["out_table"], [r[1:] for r in pre])
    app = f"bfo-emit-{unique}"
    env = {apps.OUTPUT_ENVS[name]: topic for name, topic in t.items()}
    if item_bytes is not None:
        env["PROCESSOR_BACKFILL_ITEM_BYTES"] = str(item_bytes)
    res = run_cli(backfill_argv("tests.backfill.apps:sinks", kafka_bootstrap, app, tmp_path, "--emit-outputs"), env)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-4000:])

    got = {o: _messages(kafka_bootstrap, o) for o in outs}
    # table sinks: exactly the final table, once each: the last record per key, a tombstone only
    # for a key the topic held
    held_before = [(k, v, ts, ()) for _, _, k, v, ts, _ in pre]
    expected = [r for r in last if r[1] is not None or r[0] in held]
    assert sorted(got[t["out_table"]], key=repr) == sorted(held_before + expected, key=repr)
    assert [r for r in expected if r[1] is None] == tombstoned[:3]
    for o in (t["out_sum"], t["out_count"]):
        assert sorted(got[o]) == [r for r in _last_per_key(want_out[o]) if r[1] is not None], o
    # the stream sink: every record the driver produced, in order per key
    assert len(got[t["out_stream"]]) == len(want_out[t["out_stream"]])
    assert _per_key(got[t["out_stream"]]) == _per_key(want_out[t["out_stream"]])
    assert _messages(kafka_bootstrap, f"{app}-dlq") == []
    emitted = int(re.search(r"(\d+) output record\(s\) emitted", res.stdout).group(1))
    assert _merged(tmp_path, app) == want_stores
    assert emitted == sum(len(v) for v in got.values()) - len(pre)
    report(f"emitted {emitted}: table sink {len(got[t['out_table']])} records ({len(held)} held before, 3 of "
           f"the {len(tombstoned)} keys the history ends tombstoned; driver "
           f"sent {len(want_out[t['out_table']])}), stream sink {len(got[t['out_stream']])}, sum "
           f"{len(got[t['out_sum']])} (driver {len(want_out[t['out_sum']])}), count {len(got[t['out_count']])} "
           f"(driver {len(want_out[t['out_count']])})")


@pytest.mark.integration
def test_without_emit_outputs_the_sinks_stay_empty(sinks_input, kafka_bootstrap, spark, tmp_path, unique):
    topics, history = sinks_input
    t = _sink_topics(kafka_bootstrap, topics, unique)
    topo = apps.sinks_for(t)
    app = f"bfo-quiet-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path, spark=spark)
    assert rep.rows_read == len(history) and rep.outputs_emitted == 0 and rep.dead_lettered == 0
    for o in ("out_table", "out_stream", "out_sum", "out_count"):
        assert _messages(kafka_bootstrap, t[o]) == [], o
    want_stores, _, _ = _driver(topo, topics, history)
    assert _merged(tmp_path, app) == want_stores


def _catalog_history(seed):
    """Updates of 150 keys, values {"n"} with n % 3 == 0 failing the filter, 8 % tombstones: many
    keys end with their last two real changes both failing the filter (or failing, then
    deleted) after an earlier value that passed, so the driver's last record for them is a
    tombstone sent at the transition."""
    rnd = random.Random(seed)
    return [("catalog", f"c{rnd.randrange(150):03d}".encode(),
             None if rnd.random() < 0.08 else _js({"n": rnd.randrange(12)}), None) for _ in range(1500)]


@pytest.mark.integration
@pytest.mark.parametrize("sink_holds_records", [False, True], ids=["empty-sink", "sink-holds-records"])
def test_emit_outputs_of_a_compactable_table_source(kafka_bootstrap, spark, tmp_path, unique, report,
                                                    sink_holds_records):
    """A table read only by a filter feeding a table sink. The sink's result is its final table:
    a key whose last changes fail the filter after an earlier passing value ends absent, which
    needs a tombstone only where the topic holds the key. So into an empty sink topic the source
    is reduced to its last real changes per key (the filter forwards nothing for two failing
    changes) and the sink receives exactly the driver's last record per key minus its
    tombstones; into a sink topic that holds records every record is replayed, the reason
    named, and exactly the held keys that end absent get their tombstone. (Before the rule, a
    reduction lost 22 of 63 tombstones here.)"""
    t = {"catalog": f"bfc-catalog-{unique}", "out_catalog": f"bfc-out-{unique}"}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    history = _catalog_history(seed=8)
    _produce_history(kafka_bootstrap, {"catalog": t["catalog"]}, history)
    topo = apps.compacted_sink_for(t)
    want_stores, want_out, _ = _driver(topo, t, history, [t["out_catalog"]])
    last = _last_per_key(want_out[t["out_catalog"]])
    tombstoned = [r[0] for r in last if r[1] is None]
    assert len(tombstoned) > 20   # tombstones a reduction loses
    held = tombstoned[::2] + [r[0] for r in last if r[1] is not None][:5] if sink_holds_records else []
    pre = [(key_partition(k, PARTS), k, b'{"n": 1}', T0 - 1000, None) for k in held]
    if pre:
        produce(kafka_bootstrap, t["out_catalog"], pre)
    app = f"bfc-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path, spark=spark,
                       emit_outputs=True)
    got = _messages(kafka_bootstrap, t["out_catalog"])
    expected = [(k, v, ts, ()) for _, k, v, ts, _ in pre] + [r for r in last if r[1] is not None or r[0] in held]
    report(f"compaction: {rep.compaction}; rows read {rep.rows_read}, replayed {rep.rows_replayed}; sink "
           f"{len(got)} records ({len(pre)} before), expected {len(expected)} "
           f"({sum(1 for r in expected if r[1] is None)} tombstones of {len(tombstoned)} keys the history ends)")
    assert backfill.job.compaction_plan(topo)[t["catalog"]] == "last real changes per key (table sink)"
    if sink_holds_records:
        assert rep.compaction[t["catalog"]] == (f"every record replayed (--emit-outputs: {t['out_catalog']} "
                                                f"already holds records: its tombstones need the history)")
        assert rep.rows_replayed == rep.rows_read == len(history)
        assert sum(1 for r in expected if r[1] is None) == len(tombstoned[::2])
    else:
        assert rep.compaction[t["catalog"]] == "last real changes per key (table sink)", rep.compaction
        assert rep.rows_replayed < rep.rows_read == len(history)
    assert _merged(tmp_path, app) == want_stores
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert rep.outputs_emitted == len(got) - len(pre)


# -- poison records ------------------------------------------------------------------------------------
poison_topology = apps.poison_for

POISON = [   # (at history position, name, key, value, headers); "profiles" is a compacted source
    (37, "accounts", b"a007", b"{not json", None),
    (150, "accounts", None, _js({"bal": 5, "region": "eu"}), [("trace", b"t-1")]),
    (260, "accounts", b"a013", b"\xff\xfe\x00", None),
    (333, "accounts", b"\xff\x00k", _js({"bal": 7, "region": "us"}), [("trace", b"t-2"), ("n", None)]),
    (401, "payments", b"a001", b"[1, 2", None),
    (555, "accounts", b"a021", b"", None),
    (90, "profiles", b"a030", b"{\"bal\": ", None),
    (420, "profiles", None, _js({"bal": 50, "region": "eu"}), None),
    (610, "profiles", b"a031", b"\xc3\x28", [("trace", b"t-3")]),
]


def _poison_history(seed):
    rnd = random.Random(seed)
    out = []
    for _ in range(900 - len(POISON)):
        k = f"a{rnd.randrange(60):03d}".encode()
        r = rnd.random()
        if r < 0.75:
            v = None if rnd.random() < 0.08 else _js({"bal": rnd.randrange(40),
                                                      "region": rnd.choice(["eu", "us", "apac"])})
            out.append(("accounts" if r < 0.5 else "profiles", k, v, None))
        else:
            out.append(("payments", k, _js({"amount": rnd.randrange(100)}), None))
    for at, name, k, v, hs in sorted(POISON, key=lambda x: x[0]):   # ascending: each lands at its position
        out.insert(at, (name, k, v, hs))
    return out


@pytest.mark.integration
def test_poison_records_are_dead_lettered_once_as_the_worker_does(kafka_bootstrap, spark, tmp_path, unique, report):
    t = {name: f"bfp-{name}-{unique}" for name in apps.POISON_ENVS}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    history = _poison_history(seed=3)
    placed = _produce_history(kafka_bootstrap, {n: t[n] for n in ("accounts", "profiles", "payments")}, history)
    topo = poison_topology(t)
    want_stores, _, driver_dlq = _driver(topo, t, history)

    # the dead-letter records to expect: each poison record as produced, its original headers, then
    # its provenance as the broker placed it and the step and error the driver reported
    assert len(driver_dlq) == len(POISON)
    expected = []
    for (at, *_), (k, v, ts, hs) in zip(sorted(POISON, key=lambda x: x[0]), driver_dlq, strict=False):
        topic, part, offset, pk, pv, pts, phs = placed[at]
        assert (k, v, ts) == (pk, pv, pts)
        own = hs[:len(hs) - len(DLQ_HEADERS)]
        dlq_hs = dict(hs[len(hs) - len(DLQ_HEADERS):])
        assert list(own) == list(phs or []) and sorted(dlq_hs) == sorted(DLQ_HEADERS)
        # the message names the record where the broker placed it; the rest is the driver's
        reason = dlq_hs["__streams.errors.message"].split(b": ", 1)[1]
        step = dlq_hs["processor.errors.step"]
        message = f"record {topic}[{part}]@{offset}, step {step.decode()}: ".encode() + reason
        expected.append((pk, pv, pts, (*own, ("__streams.errors.exception", dlq_hs["__streams.errors.exception"]),
                                       ("__streams.errors.message", message),
                                       ("__streams.errors.stacktrace", dlq_hs["__streams.errors.stacktrace"]),
                                       ("__streams.errors.topic", topic.encode()),
                                       ("__streams.errors.partition", str(part).encode()),
                                       ("__streams.errors.offset", str(offset).encode()),
                                       ("processor.errors.step", step))))

    def provenance(r):
        h = dict(r[3])
        return h["__streams.errors.topic"], int(h["__streams.errors.partition"]), int(h["__streams.errors.offset"])

    expected.sort(key=provenance)
    app = f"bfp-bf-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path / "bf",
                       spark=spark)
    assert rep.compaction[t["profiles"]].startswith("last real changes per key"), rep.compaction
    assert rep.compaction[t["accounts"]].startswith("every record replayed"), rep.compaction
    got = sorted(_messages(kafka_bootstrap, f"{app}-dlq"), key=provenance)
    assert rep.dead_lettered == len(POISON)
    assert got == expected

    wapp = f"bfp-live-{unique}"
    w = Worker(topo, kafka_bootstrap, wapp, tmp_path / "live", consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    live = sorted(_messages(kafka_bootstrap, f"{wapp}-dlq"), key=provenance)
    assert live == expected
    assert got == live

    assert _merged(tmp_path / "bf", app) == want_stores
    assert _merged(tmp_path / "live", wapp) == want_stores
    # and task by task every contract column family, bookkeeping included, equals the live worker's
    assert without_application_id(contract_column_families(tmp_path / "bf", app), app) == \
        without_application_id(contract_column_families(tmp_path / "live", wapp), wapp)
    report(f"{len(got)} dead-lettered by the backfill and by the worker, equal; steps "
           f"{sorted({dict(r[3])['processor.errors.step'].decode() for r in got})}")


@pytest.mark.integration
def test_user_function_failures_on_a_reduced_table_give_the_workers_stores_and_dead_letters(
        kafka_bootstrap, spark, tmp_path, unique, report):
    """The plan reduces ``catalog`` to its last real changes per key, but its filter raises on
    some values: the worker dead-letters every failing record (superseded ones too) and keeps the
    key's previous value, so the backfill replays such a task record by record and must give the
    worker's stores and dead-letter records exactly. Key ``zz`` ends with two failing changes
    after a passing one: a reduction would have lost its value."""
    t = {"catalog": f"bfu-catalog-{unique}", "out_catalog": f"bfu-out-{unique}"}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    rnd = random.Random(5)
    history = [("catalog", f"c{rnd.randrange(40):03d}".encode(),
                None if rnd.random() < 0.08 else _js({"n": rnd.randrange(40)}), None) for _ in range(600)]
    history += [("catalog", b"zz", _js({"n": 5}), None), ("catalog", b"zz", _js({"n": 13}), None),
                ("catalog", b"zz", _js({"n": 26}), None)]
    failing = sum(1 for _, _, v, _ in history if v is not None and json.loads(v)["n"] % 13 == 0)
    placed = _produce_history(kafka_bootstrap, {"catalog": t["catalog"]}, history)
    topo = apps.failing_catalog_for(t)
    want_stores, _, driver_dlq = _driver(topo, t, history)
    assert len(driver_dlq) == failing

    def provenance(r):
        h = dict(r[3])
        return h["__streams.errors.topic"], int(h["__streams.errors.partition"]), int(h["__streams.errors.offset"])

    app = f"bfu-bf-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path / "bf",
                       spark=spark)
    # the plan reduces it; the records that failed made the backfill replay every record
    assert backfill.job.compaction_plan(topo.for_application(app))[t["catalog"]].startswith("last real changes")
    assert rep.compaction[t["catalog"]].startswith("every record replayed (records failed in processing: "
                                                   f"{t['catalog']}: "), rep.compaction
    wapp = f"bfu-live-{unique}"
    w = Worker(topo, kafka_bootstrap, wapp, tmp_path / "live", consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    got = sorted(_messages(kafka_bootstrap, f"{app}-dlq"), key=provenance)
    live = sorted(_messages(kafka_bootstrap, f"{wapp}-dlq"), key=provenance)
    assert len(live) == failing and got == live
    want_positions = sorted((t["catalog"].encode(), p, o) for (_, p, o, _, v, _, _) in placed
                            if v is not None and json.loads(v)["n"] % 13 == 0)
    assert [provenance(r) for r in got] == want_positions
    assert _merged(tmp_path / "bf", app) == want_stores
    assert _merged(tmp_path / "live", wapp) == want_stores
    assert b"zz" in dict(want_stores["catalog"])     # its passing value, kept
    assert without_application_id(contract_column_families(tmp_path / "bf", app), app) == \
        without_application_id(contract_column_families(tmp_path / "live", wapp), wapp)
    report(f"reduced table with a raising filter: {failing} failing records dead-lettered by the backfill and "
           f"the worker, equal; rows read {rep.rows_read}, replayed {rep.rows_replayed} (the history processed "
           f"again record by record); stores equal the worker's and the driver's")


@pytest.mark.integration
def test_poison_records_under_skip_and_fail_follow_the_policy_as_the_worker_does(kafka_bootstrap, spark, tmp_path,
                                                                                 unique, report):
    """``on_error="skip"``: nothing dead-lettered (no dead-letter topic), stores as the driver's
    under skip. ``on_error="fail"``: the worker stops with the record's error (exit code 6, naming
    the record); ``processor backfill --on-error fail`` must stop the same way (exit 6, one
    ``processor: error: record ...`` line) and leave nothing behind (no state, no build root, no
    group offsets)."""
    t = {name: f"bfq-{name}-{unique}" for name in apps.POISON_ENVS}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    history = _poison_history(seed=4)
    placed = _produce_history(kafka_bootstrap, {n: t[n] for n in ("accounts", "profiles", "payments")}, history)
    poison_at = {f"{placed[at][0]}[{placed[at][1]}]@{placed[at][2]}" for at, *_ in POISON}
    topo = poison_topology(t)

    with TopologyTestDriver(topo, application_id="drv", on_error="skip") as d:
        for i, (name, k, v, hs) in enumerate(history):
            d.pipe_raw(t[name], k, v, timestamp=T0 + i, headers=hs)
        want = {}
        for task in d.tasks:
            for spec in task.store_specs:
                want.setdefault(spec.name, {}).update(task.stores.store(spec.name).items())
    want = {n: sorted(v.items()) for n, v in want.items()}
    app = f"bfq-skip-{unique}"
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path / "skip",
                       spark=spark, on_error="skip")
    assert rep.dead_lettered == 0
    assert f"{app}-dlq" not in kafka.topic_partitions(kafka_bootstrap)
    assert _merged(tmp_path / "skip", app) == want

    w = Worker(topo, kafka_bootstrap, f"bfq-live-{unique}", tmp_path / "live", on_error="fail",
               consumer_config=TEST_CONSUMER_CONFIG)
    with pytest.raises(ProcessorError) as live:
        w.run(until_drained=True, install_signal_handlers=False)
    assert live.value.exit_code == 6
    assert any(p in str(live.value) for p in poison_at), str(live.value)

    # the command under --on-error fail: exit 6 and the record's error as one `processor: error:`
    # line, like `processor run --on-error fail` (Spark's own log lines aside); nothing left behind
    app = f"bfq-fail-{unique}"
    env = {apps.POISON_ENVS[name]: topic for name, topic in t.items()}
    res = run_cli(backfill_argv("tests.backfill.apps:poison", kafka_bootstrap, app, tmp_path / "fail",
                                "--on-error", "fail"), env)
    state_left = sorted(p.name for p in (tmp_path / "fail").iterdir()) if (tmp_path / "fail").exists() else []
    last = (res.stderr.strip().splitlines() or [""])[-1]
    report(f"worker: {type(live.value).__name__} (exit {live.value.exit_code}): {str(live.value)[:160]}")
    telling = [ln[:240] for ln in res.stderr.splitlines()
               if ln.startswith(("Traceback", "processor: error", "pyspark.", "processor.errors."))]
    report(f"backfill --on-error fail: exit {res.returncode}, {len(res.stderr.splitlines())} stderr line(s), "
           f"last: {last[:200]!r}; telling lines: {telling[:6]}")
    assert state_left == []
    assert all(off < 0 for off in committed_offsets(kafka_bootstrap, app, t["accounts"], PARTS).values())
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("processor: error: ")]
    assert res.returncode == live.value.exit_code == 6, telling
    assert len(errors) == 1 and errors[0].startswith("processor: error: record "), errors
    assert any(p in errors[0] for p in poison_at), errors[0]
