"""The ``processor backfill`` command when things go wrong (issue 13 item 9), run as a subprocess
on the real broker with its own local Spark: a backfill SIGKILLed mid-way (after its first run, or
once its runs are done and task databases and changelogs are being written) leaves no task
directory and no committed group offsets, and a re-run with the same arguments exits 0 with
stores byte-identical to a backfill that was never interrupted (and a worker restoring from the
changelogs on another state directory gets the same bytes); a state directory that already holds
the application's state, or a group that has committed offsets, is refused with exit 2 and one
line; ``--force`` replaces the state; an unreachable broker exits 3.

History (module fixture, shared): 12,000 order updates over 3,000 keys (3 partitions) and 1,500
customer updates (3 partitions), interleaved in time; the topology (``tests.backfill.apps.fk_aggregate``) has a
repartition + integer sum per customer and a foreign-key left join feeding a repartition +
integer sum per tier, so a backfill takes several Spark runs. The uninterrupted reference is
``backfill.run`` into its own state directory under another application id (changelog, internal
topics and group are named after the application id), so store bytes are compared with each
application id replaced by a placeholder (internal topic names appear in ``_bookkeeping`` keys)."""

import json
import random
import time
import uuid

import pytest
from confluent_kafka import OFFSET_INVALID

import backfill
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from processor.testing import TopologyTestDriver
from tests.backfill import apps
from tests.backfill.helpers import (
    backfill_argv,
    contract_column_families,
    kill_session,
    run_cli,
    start_cli,
    wait_for_line,
    without_application_id,
)
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import committed_offsets, produce

PARTS = 3
T0 = 1_000_000
SPEC = "tests.backfill.apps:fk_aggregate"


def _js(v):
    return json.dumps(v, separators=(",", ":"), sort_keys=True).encode()


def _history(seed: int, orders: int, customers: int):
    """``[("orders" | "customers", key, value | None)]``, interleaved; order ``i`` of the whole
    sequence has timestamp ``T0 + i``."""
    rnd = random.Random(seed)
    out = []
    for _ in range(orders + customers):
        if rnd.random() < orders / (orders + customers):
            k = f"o{rnd.randrange(3000):05d}".encode()
            v = None if rnd.random() < 0.05 else _js({"customer": f"c{rnd.randrange(450):03d}",
                                                      "amount": rnd.randrange(1, 100)})
            out.append(("orders", k, v))
        else:
            k = f"c{rnd.randrange(400):03d}".encode()      # c400..c449: orders whose customer never exists
            v = None if rnd.random() < 0.05 else _js({"tier": rnd.choice(["gold", "silver", "bronze"])})
            out.append(("customers", k, v))
    return out


def _diff(got: dict, want: dict) -> str:
    """Where two ``contract_column_families`` results differ (for failure messages)."""
    lines = []
    for task in sorted(set(got) | set(want)):
        g, w = got.get(task), want.get(task)
        if g is None or w is None:
            lines.append(f"{task}: only in {'expected' if g is None else 'got'}")
            continue
        for cf in sorted(set(g) | set(w)):
            gi, wi = dict(g.get(cf, [])), dict(w.get(cf, []))
            if gi != wi:
                keys = set(gi) ^ set(wi)
                vals = [k for k in set(gi) & set(wi) if gi[k] != wi[k]]
                lines.append(f"{task}/{cf}: {len(gi)} vs {len(wi)} entries, {len(keys)} keys in one only "
                             f"(e.g. {sorted(keys)[:3]}), {len(vals)} values differ (e.g. {sorted(vals)[:3]})")
    return "; ".join(lines) or "equal"


@pytest.fixture(scope="module")
def history(kafka_bootstrap, spark, tmp_path_factory):
    """Topics with the history, the env that names them, and the stores of an uninterrupted
    backfill (``{task: {column family: [(key, value)]}}``) with its report."""
    tag = uuid.uuid4().hex[:8]
    topics = {"orders": f"bff-orders-{tag}", "customers": f"bff-customers-{tag}"}
    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics.values()})
    recs = _history(seed=13, orders=12_000, customers=1_500)
    for name, topic in topics.items():
        idx = [i for i, (n, _, _) in enumerate(recs) if n == name]
        produce(kafka_bootstrap, topic, [recs[i][1:] for i in idx], timestamps=[T0 + i for i in idx])
    topo = apps.fk_aggregate_for(topics["orders"], topics["customers"])
    ref_dir = tmp_path_factory.mktemp("reference")
    ref_app = f"bff-ref-{tag}"
    t0 = time.monotonic()
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=ref_app, state_dir=ref_dir,
                       spark=spark)
    seconds = time.monotonic() - t0
    stores = without_application_id(contract_column_families(ref_dir, ref_app), ref_app)
    assert rep.rows_read == len(recs)
    assert sorted(stores) == [f"task-{s}_{p}" for s in range(len(topo.subtopologies)) for p in range(PARTS)]
    env = {apps.ORDERS_ENV: topics["orders"], apps.CUSTOMERS_ENV: topics["customers"]}
    return {"topics": topics, "records": recs, "topology": topo, "env": env, "stores": stores, "report": rep,
            "seconds": seconds}


@pytest.mark.integration
def test_reference_backfill_equals_the_driver(history, report):
    """The reference is right: its stores equal the test driver's after the same history (the
    foreign-key join result by keys and value bytes, its timestamp aside: docs/backfill.md "Same stores")."""
    topo, topics = history["topology"], history["topics"]
    with TopologyTestDriver(topo, application_id="drv") as d:
        for i, (name, k, v) in enumerate(history["records"]):
            d.pipe_raw(topics[name], k, v, timestamp=T0 + i)
        want = {}
        for t in d.tasks:
            for spec in t.store_specs:
                want.setdefault(spec.name, {}).update(t.stores.store(spec.name).items())
    got = {}
    for cfs in history["stores"].values():
        for cf, items in cfs.items():
            got.setdefault(cf, {}).update(items)
    for name in ("orders", "customers", "revenue-by-customer", "revenue-by-customer.emitted"):
        assert sorted(got[name].items()) == sorted(want[name].items()), name
    assert sorted((k, v[8:]) for k, v in got["enriched"].items()) == \
        sorted((k, v[8:]) for k, v in want["enriched"].items())
    assert len(got["orders"]) > 2000 and len(got["revenue-by-customer"]) > 300 and len(got["revenue-by-tier"]) == 4
    rep = history["report"]
    report(f"reference backfill: {rep.rows_read} rows, {len(rep.runs)} runs, {history['seconds']:.1f} s "
           f"(in-process session); stores {rep.rows_per_store}")


def _wait_for_built_task(proc, state, app, log_path, timeout_s: float = 300.0) -> str:
    """Wait until the build root holds a task database (``task-*`` or ``task-*.partial``): the
    job is past its runs and has written that task's changelogs (``FinalizeTask`` produces
    them before it builds the database). Returns its name."""
    deadline = time.monotonic() + timeout_s
    while True:
        built = sorted(p.name for p in state.glob(f"{app}.backfill-tmp-*/task-*"))
        if built:
            return built[0]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no task database in the build root (exit {proc.returncode}); log tail:\n"
                                 f"{open(log_path, errors='replace').read()[-3000:]}")
        time.sleep(0.01)


@pytest.mark.integration
@pytest.mark.parametrize("kill_at", ["first-run", "writing-stores"])
def test_killed_backfill_leaves_nothing_and_a_rerun_succeeds(kill_at, history, kafka_bootstrap, tmp_path,
                                                             unique, report):
    """SIGKILL the command when its log shows the first run done (history still being
    processed), or when the first task database appears in its build root (a sub-topology's
    last run, or the final stage, is writing changelogs and building task databases); then no ``task-*`` directory, no
    committed group offsets; the same command again exits 0, removes the killed run's build
    root, and leaves stores equal to the uninterrupted backfill's; a worker on an empty state
    directory restores the same bytes from the changelogs (for the late kill: the killed run's
    records, then the re-run's)."""
    app, state = f"bff-kill-{unique}", tmp_path / "state"
    argv = backfill_argv(SPEC, kafka_bootstrap, app, state)
    assert len(history["report"].runs) >= 3, history["report"].runs

    t0 = time.monotonic()
    log_path = tmp_path / "killed.log"
    proc = start_cli(argv, history["env"], log_path)
    try:
        if kill_at == "first-run":
            where = wait_for_line(proc, log_path, r"backfill run 0: ").split(": ", 1)[-1][:80]
        else:
            where = f"{_wait_for_built_task(proc, state, app, log_path)} in the build root"
        assert proc.poll() is None, "the backfill finished before it could be killed"
    finally:
        killed_after = time.monotonic() - t0
        survivors = kill_session(proc)   # also on failure: no Spark JVM left running
    assert proc.returncode == -9
    with open(log_path, errors="replace") as f:
        runs_logged = sum(1 for line in f if "backfill run " in line)

    target = state / app
    assert not target.exists() or not list(target.glob("task-*")), sorted(p.name for p in target.iterdir())
    leftovers = sorted(p.name for p in state.iterdir())
    assert leftovers and all(n.startswith(f"{app}.backfill-tmp-") for n in leftovers), leftovers
    for topic in history["topics"].values():
        assert committed_offsets(kafka_bootstrap, app, topic, PARTS) == {p: OFFSET_INVALID for p in range(PARTS)}, topic
    changelog_records = sum(len(kafka.read_topic(kafka_bootstrap, t)) for t in kafka.topic_partitions(kafka_bootstrap)
                            if t.startswith(f"{app}-") and t.endswith("-changelog"))
    if kill_at == "first-run":
        assert runs_logged < len(history["report"].runs) and changelog_records == 0
    else:
        # a sub-topology's last run writes its tasks' changelogs and databases: the kill came
        # during or after the first such run
        assert runs_logged >= 1 and changelog_records > 0

    t1 = time.monotonic()
    rerun = run_cli(argv, history["env"])
    rerun_s = time.monotonic() - t1
    assert rerun.returncode == 0, (rerun.stdout[-2000:], rerun.stderr[-4000:])
    assert sorted(p.name for p in state.iterdir()) == [app]
    got = without_application_id(contract_column_families(state, app), app)
    assert got == history["stores"], _diff(got, history["stores"])
    for topic in history["topics"].values():
        assert committed_offsets(kafka_bootstrap, app, topic, PARTS) == \
            {p: history["report"].snapshot[(topic, p)][1] for p in range(PARTS)}, topic

    # the changelogs (written twice for the late kill: the killed run's records, then the re-run's
    # contents with tombstones for what it does not hold) restore the same state elsewhere
    w = Worker(history["topology"], kafka_bootstrap, app, tmp_path / "restored", consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == 0
    restored = without_application_id(contract_column_families(tmp_path / "restored", app), app)
    assert restored == history["stores"], _diff(restored, history["stores"])
    report(f"{kill_at}: killed at {killed_after:.1f} s ({where!r}, {runs_logged} run(s) logged); "
           f"{len(survivors)} process(es) of its session outlived the driver; changelogs held "
           f"{changelog_records} record(s) at the kill; re-run {rerun_s:.1f} s")


@pytest.mark.integration
def test_existing_state_is_refused_and_force_replaces_it(history, kafka_bootstrap, spark, tmp_path, unique, report):
    app, state = f"bff-force-{unique}", tmp_path / "state"
    backfill.run(history["topology"], bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=state,
                 spark=spark)
    before = without_application_id(contract_column_families(state, app), app)
    assert before == history["stores"], _diff(before, history["stores"])

    # state directory holds the application's state: exit 2, one line naming it, nothing touched
    argv = backfill_argv(SPEC, kafka_bootstrap, app, state)
    t0 = time.monotonic()
    refused = run_cli(argv, history["env"])
    refused_s = time.monotonic() - t0
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stdout == ""
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("processor: error: "), lines
    assert str(state / app) in lines[0] and "--force" in lines[0], lines[0]
    assert without_application_id(contract_column_families(state, app), app) == before
    assert sorted(p.name for p in state.iterdir()) == [app]

    # an empty state directory, but the group has committed offsets: exit 2, one line naming the group
    other = tmp_path / "other"
    refused = run_cli(backfill_argv(SPEC, kafka_bootstrap, app, other), history["env"])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("processor: error: "), lines
    assert f"consumer group {app!r}" in lines[0], lines[0]
    assert not other.exists() or not any(other.iterdir())

    # --force replaces it: a stray file and a task directory the topology does not have are gone
    (state / app / "task-0_0" / "STRAY").write_text("left by hand")
    (state / app / "task-9_9").mkdir()
    t1 = time.monotonic()
    forced = run_cli(argv + ["--force"], history["env"])
    forced_s = time.monotonic() - t1
    assert forced.returncode == 0, (forced.stdout[-2000:], forced.stderr[-4000:])
    assert sorted(p.name for p in state.iterdir()) == [app]
    assert sorted(p.name for p in (state / app).glob("task-*")) == sorted(history["stores"])
    assert not (state / app / "task-0_0" / "STRAY").exists()
    got = without_application_id(contract_column_families(state, app), app)
    assert got == history["stores"], _diff(got, history["stores"])
    report(f"refusal {refused_s:.1f} s; --force {forced_s:.1f} s")


@pytest.mark.integration
def test_unreachable_broker_exits_3(tmp_path):
    state = tmp_path / "state"
    env = {apps.ORDERS_ENV: "bff-orders-x", apps.CUSTOMERS_ENV: "bff-customers-x"}
    t0 = time.monotonic()
    res = run_cli(backfill_argv(SPEC, "127.0.0.1:1", "bff-nobroker", state), env, timeout_s=120)
    seconds = time.monotonic() - t0
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("processor: error: "), lines
    assert "127.0.0.1:1" in lines[0], lines[0]
    assert not state.exists() or not any(state.iterdir())
    assert seconds < 60
