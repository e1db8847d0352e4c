"""The backfill on a Spark standalone cluster whose executors see none of the driver's files
(``spark_cluster``: the worker in a private mount namespace, a tmpfs over the test's temporary
directories and over the repository's ``tests`` package). Everything between the job's stages
must move through Spark, the topology's module must be shipped by the job, and the hand-off must
work from the changelogs alone. Each backfill runs in a process of its own (``cluster_job`` or
the ``processor backfill`` command): one SparkContext per process, and the test process holds
the local one.

- the differential of the FK-join (one and three partitions), aggregation and stream-stream
  families against the test driver, as ``test_backfill_differential`` does on ``local[2]``;
- the hand-off without ``--state-dir``: a worker on an empty state directory restores from the
  changelogs exactly the stores a backfill with ``--state-dir`` leaves (byte for byte), then
  continues at the snapshot: stores equal the driver's over the whole history, a stream count
  per key shows no gap and no duplicate;
- a SIGKILL mid-run leaves no state, no group offsets and no application on the cluster, and a
  re-run equals an uninterrupted backfill;
- bad input, each one line and a non-zero exit with nothing left: ``--py-files`` that does not
  exist, a module that cannot be shipped, a cluster with no free cores for the job.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import OFFSET_INVALID

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.backfill import apps
from tests.backfill import test_backfill_differential as diff
from tests.backfill import test_backfill_handoff as handoff
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
from tests.integration.helpers import committed_offsets

pytestmark = pytest.mark.integration


def cluster_backfill(factory: str, args: list, run_kwargs: dict, timeout_s: float = 300, env=None) -> dict:
    """``backfill.run(factory(*args), **run_kwargs)`` in a process of its own; its report."""
    import sys

    spec = json.dumps({"factory": factory, "args": args, "run": run_kwargs})
    res = run_cli([sys.executable, "-m", "tests.backfill.cluster_job", spec], env or {}, timeout_s=timeout_s)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-6000:])
    line = [x for x in res.stdout.splitlines() if x.startswith("REPORT ")][-1]
    rep = json.loads(line[len("REPORT "):])
    rep["log"] = res.stderr
    return rep


def _shipped(log: str) -> str:
    lines = [x for x in log.splitlines() if "shipped to the executors" in x]
    assert lines, "the job shipped nothing: the executors could not import the topology's module"
    return lines[-1]


@pytest.mark.parametrize("case", ["fk_joins", "fk_joins_3", "fk_self_join", "table_aggregates", "stream_aggregates",
                                  "stream_stream"])
def test_cluster_backfill_stores_equal_the_drivers(case, spark_cluster, kafka_bootstrap, tmp_path, unique, report):
    topo, topics, history = diff.case_input(case, kafka_bootstrap, unique, prefix="dc")
    app = f"dc-{case}-{unique}"
    # fk_joins_3: every stores, rows and database item cut into pieces of at most 2 KiB on its way
    # (pieces.to_pieces; 256 MiB by default, under the 2 GiB a JVM byte array holds)
    env = {"PROCESSOR_BACKFILL_ITEM_BYTES": "2048"} if case == "fk_joins_3" else {}
    rep = cluster_backfill(f"tests.backfill.test_backfill_differential:{diff.CASES[case][0].__name__}", [topics],
                           {"bootstrap_servers": kafka_bootstrap, "application_id": app,
                            "state_dir": str(tmp_path), "master": spark_cluster.master_url}, env=env)
    assert rep["rows_read"] == len(history)
    # the cluster's executors, in their own mount namespace, run the compiled build the driver runs
    assert rep["driver_build"].startswith("compiled (") and set(rep["executor_builds"]) == {rep["driver_build"]}
    sizes = diff.check_stores(case, topo, topics, history, tmp_path, app)
    report(f"{case} on the cluster: {len(history)} records, {rep['runs']} run(s), stores {sizes}, "
           f"stages {', '.join(f'{k} {v:.1f} s' for k, v in rep['seconds'].items())}")


def test_cluster_backfill_hands_over_through_the_changelogs(spark_cluster, kafka_bootstrap, tmp_path, unique, report):
    topics = {"orders": f"bfc-orders-{unique}", "shipments": f"bfc-ship-{unique}", "clicks": f"bfc-clicks-{unique}"}
    args = [topics["orders"], topics["clicks"], topics["shipments"]]
    topo = handoff.make_topology(*args)
    outs = topo.sink_topics(internal=False)
    parts = handoff.PARTS
    kafka.create_topics(kafka_bootstrap, {**{t: parts for t in topics.values()}, **{t: parts for t in outs}})
    t0 = 1_000_000
    first = handoff.history(3000, seed=21)
    handoff._produce_all(kafka_bootstrap, topics, first, t0)

    # the same history backfilled twice on the cluster: with --state-dir (the layout the driver
    # builds from what reached it through Spark), and without (the changelogs only)
    ref_app, app = f"bfc-ref-{unique}", f"bfc-app-{unique}"
    run = {"bootstrap_servers": kafka_bootstrap, "master": spark_cluster.master_url}
    ref = cluster_backfill("tests.backfill.test_backfill_handoff:make_topology", args,
                           {**run, "application_id": ref_app, "state_dir": str(tmp_path / "ref")})
    rep = cluster_backfill("tests.backfill.test_backfill_handoff:make_topology", args,
                           {**run, "application_id": app})
    assert rep["rows_read"] == ref["rows_read"] == len(first)
    assert rep["installed"] == [] and not (tmp_path / "state").exists()
    expected = handoff._driver_stores(topo, topics, first, t0)
    built = handoff._state_stores(tmp_path / "ref", ref_app, list(topo.stores))
    for name in topo.stores:
        assert list(built[name].items()) == list(expected[name].items()), name

    # a worker on an empty state directory restores the backfill's stores from the changelogs
    state = tmp_path / "state"
    w = Worker(topo, kafka_bootstrap, app, state, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == 0
    restored = without_application_id(contract_column_families(state, app), app)
    assert restored == without_application_id(contract_column_families(tmp_path / "ref", ref_app), ref_app)

    # then continues at the snapshot
    second = handoff.history(1500, seed=22)
    handoff._produce_all(kafka_bootstrap, topics, second, t0 + len(first))
    w = Worker(topo, kafka_bootstrap, app, state, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == len(second)
    everything = first + second
    expected = handoff._driver_stores(topo, topics, everything, t0)
    got = handoff._state_stores(state, app, list(topo.stores))
    for name in topo.stores:
        assert list(got[name].items()) == list(expected[name].items()), name
    n_clicks: dict = {}
    for kind, k, _ in everything:
        if kind == "clicks":
            n_clicks[k] = n_clicks.get(k, 0) + 1
    assert {k: json.loads(v[8:]) for k, v in got["clicks-per-user"].items()} == n_clicks
    sink = kafka.read_topic(kafka_bootstrap, f"{topics['clicks']}-counts")
    assert len(sink) == len([1 for kind, _, _ in second if kind == "clicks"])
    report(f"hand-off on the cluster: {rep['rows_read']} rows backfilled without a state directory "
           f"({sum(rep['seconds'].values()):.1f} s), restored byte for byte, then {w.records_processed} "
           f"records processed after the snapshot")


# a namespace package (no __init__.py) whose app module imports a top-level helper module: the
# job must ship both (the helper only through the app module's own imports)
APP_PACKAGE = {
    "shipped_rules.py": (
        "def big(key, value):\n"
        "    return value['amount'] > 50\n\n\n"
        "def doubled(value):\n"
        "    return {'amount': value['amount'] * 2}\n"),
    "shipped_app/app.py": (
        "import os\n\n"
        "import shipped_rules\n"
        "from processor import StreamsBuilder\n\n\n"
        "def big_order(key, value):\n"
        "    return shipped_rules.big(key, value)\n\n\n"
        "def as_doubled(value):\n"
        "    return shipped_rules.doubled(value)\n\n\n"
        "def topology():\n"
        "    b = StreamsBuilder()\n"
        "    b.table(os.environ['BF_TEST_ORDERS'], store_name='orders').filter(big_order).map_values(as_doubled)\\\n"
        "        .to_stream().to(os.environ['BF_TEST_ORDERS'] + '-big')\n"
        "    return b.build()\n"),
}


def test_cluster_backfill_ships_the_topology_package(spark_cluster, kafka_bootstrap, tmp_path, unique, report):
    """A topology whose functions are named functions of a namespace package the executors do
    not have (in the test's temporary directory, hidden from them), calling a module that package
    imports: the job ships both, and the stores equal the driver's."""
    import importlib
    import sys

    from processor.testing import TopologyTestDriver

    topics, env = _fk_history(kafka_bootstrap, f"ship-{unique}")
    kafka.create_topics(kafka_bootstrap, {topics["orders"] + "-big": 3})
    root = tmp_path / "code"
    for name, text in APP_PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    app = f"bfcs-{unique}"
    # the sink topic already holds keys (found below: those the history ends absent get tombstones)
    held = [f"o{i:05d}" for i in range(0, 3000, 7)]
    producer = kafka.new_producer(kafka.producer_defaults(kafka_bootstrap), "test")
    for k in held:
        producer.produce(topics["orders"] + "-big", b'{"amount": -1}', k.encode())
    producer.flush(30)
    res = run_cli(backfill_argv("shipped_app.app:topology", kafka_bootstrap, app, tmp_path / "state",
                                "--emit-outputs", master=spark_cluster.master_url), {**env, "PYTHONPATH": str(root)})
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-6000:])
    shipped = _shipped(res.stderr)
    assert str(root / "shipped_app") in shipped and str(root / "shipped_rules.py") in shipped, shipped
    got = contract_column_families(tmp_path / "state", app)

    sys.path.insert(0, str(root))
    try:
        import os
        os.environ[apps.ORDERS_ENV] = topics["orders"]
        topo = importlib.import_module("shipped_app.app").topology()
    finally:
        sys.path.remove(str(root))
        for m in [m for m in sys.modules if m.startswith(("shipped_app", "shipped_rules"))]:
            del sys.modules[m]
    from tests.backfill import test_backfill_failures as failures
    recs = failures._history(seed=31, orders=6000, customers=900)
    with TopologyTestDriver(topo, application_id=app) as d:
        for i, (name, k, v) in enumerate(recs):
            if name == "orders":
                d.pipe_raw(topics["orders"], k, v, timestamp=failures.T0 + i)
        want = sorted((k, v) for t in d.tasks for k, v in t.stores.store("orders").items())
        last: dict = {}
        for r in d.read_output(topics["orders"] + "-big"):
            last[r.key] = r.value
    assert sorted(kv for per in got.values() for kv in per["orders"]) == want
    assert len(want) > 1000
    # --emit-outputs on the cluster (outputs through Spark): the table's sink receives the
    # driver's last record per key, once each, a tombstone only for a key it held
    sink = [m for m in kafka.read_topic(kafka_bootstrap, topics["orders"] + "-big") if m.value() != b'{"amount": -1}']
    expected = {k: v for k, v in last.items() if v is not None or k in held}
    owed = sum(v is None for v in expected.values())
    assert owed > 0 and sum(v is None for v in last.values()) > owed
    assert sorted((m.key().decode(), None if m.value() is None else json.loads(m.value())) for m in sink) == \
        sorted(expected.items(),
               key=lambda kv: (kv[0], kv[1] is not None, json.dumps(kv[1], sort_keys=True)))
    assert len(sink) == len(expected)
    report(f"shipped to the cluster: {shipped.split(': ', 2)[-1]}; {len(want)} orders in the store")


def _fk_history(kafka_bootstrap, tag):
    from tests.backfill import test_backfill_failures as failures

    topics = {"orders": f"bfck-orders-{tag}", "customers": f"bfck-customers-{tag}"}
    kafka.create_topics(kafka_bootstrap, {t: failures.PARTS for t in topics.values()})
    recs = failures._history(seed=31, orders=6000, customers=900)
    for name, topic in topics.items():
        idx = [i for i, (n, _, _) in enumerate(recs) if n == name]
        from tests.integration.helpers import produce
        produce(kafka_bootstrap, topic, [recs[i][1:] for i in idx], timestamps=[failures.T0 + i for i in idx])
    return topics, {apps.ORDERS_ENV: topics["orders"], apps.CUSTOMERS_ENV: topics["customers"]}


def test_cluster_backfill_killed_mid_run_leaves_nothing(spark_cluster, kafka_bootstrap, tmp_path, unique, report):
    from tests.backfill.test_backfill_failures import PARTS, SPEC, _diff

    topics, env = _fk_history(kafka_bootstrap, unique)
    ref_app, app = f"bfck-ref-{unique}", f"bfck-{unique}"
    ref = run_cli(backfill_argv(SPEC, kafka_bootstrap, ref_app, tmp_path / "ref", master=spark_cluster.master_url),
                  env)
    assert ref.returncode == 0, (ref.stdout[-2000:], ref.stderr[-4000:])
    want = without_application_id(contract_column_families(tmp_path / "ref", ref_app), ref_app)
    assert len(want) == 4 * PARTS

    state = tmp_path / "state"
    argv = backfill_argv(SPEC, kafka_bootstrap, app, state, master=spark_cluster.master_url)
    log_path = tmp_path / "killed.log"
    proc = start_cli(argv, env, log_path)
    try:
        where = wait_for_line(proc, log_path, r"backfill run 0: ").split(": ", 1)[-1][:80]
        assert proc.poll() is None, "the backfill finished before it could be killed"
    finally:
        kill_session(proc)
    assert not (state / app).exists() or not list((state / app).glob("task-*"))
    for topic in topics.values():
        assert committed_offsets(kafka_bootstrap, app, topic, PARTS) == {p: OFFSET_INVALID for p in range(PARTS)}
    deadline = time.monotonic() + 60
    while spark_cluster.running_apps() and time.monotonic() < deadline:   # the master notices the driver's end
        time.sleep(0.5)
    assert spark_cluster.running_apps() == 0

    rerun = run_cli(argv, env)
    assert rerun.returncode == 0, (rerun.stdout[-2000:], rerun.stderr[-4000:])
    assert sorted(p.name for p in state.iterdir()) == [app]
    got = without_application_id(contract_column_families(state, app), app)
    assert got == want, _diff(got, want)
    report(f"killed on the cluster after {where!r}; the re-run's stores equal the uninterrupted backfill's")


def test_cluster_bad_input_is_one_line_and_leaves_nothing(spark_cluster, kafka_bootstrap, tmp_path, unique, report):
    topics, env = _fk_history(kafka_bootstrap, f"bad-{unique}")
    from tests.backfill.test_backfill_failures import SPEC

    def refused(argv, env_=env, code=2):
        t0 = time.monotonic()
        res = run_cli(argv, env_, timeout_s=180)
        secs = time.monotonic() - t0
        assert res.returncode == code, (res.stdout[-2000:], res.stderr[-4000:])
        # one line of error, the last (before it: Spark's JVM and the job's progress log, if started)
        lines = [x for x in res.stderr.splitlines() if "error" in x.lower()]
        assert len(lines) == 1 and lines[0].startswith("processor: error: "), res.stderr[-4000:]
        assert res.stderr.splitlines()[-1] == lines[0] and "Traceback" not in res.stderr, res.stderr[-4000:]
        assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
        for topic in topics.values():
            assert committed_offsets(kafka_bootstrap, app, topic, 3) == {p: OFFSET_INVALID for p in range(3)}
        return lines[0], secs

    app = f"bfcb-{unique}"
    base = backfill_argv(SPEC, kafka_bootstrap, app, tmp_path / "state", master=spark_cluster.master_url)

    # more code that does not exist
    line, secs = refused(base + ["--py-files", str(tmp_path / "missing.zip")])
    assert "missing.zip" in line and "does not exist" in line
    report(f"--py-files missing: {secs:.1f} s: {line}")

    # a topology whose function comes from a module that has no file to ship
    mod = tmp_path / "appmods" / "volatile_app.py"
    mod.parent.mkdir()
    mod.write_text(
        "import os, sys, types\n"
        "from processor import StreamsBuilder\n"
        "gen = types.ModuleType('generated_fns')\n"
        "exec('def positive(k, v):\\n    return True\\n', gen.__dict__)\n"
        "sys.modules['generated_fns'] = gen\n"
        "def topology():\n"
        "    b = StreamsBuilder()\n"
        "    b.table(os.environ['BF_TEST_ORDERS'], store_name='o').filter(gen.positive)\n"
        "    return b.build()\n")
    line, secs = refused(backfill_argv("volatile_app:topology", kafka_bootstrap, app, tmp_path / "state",
                                       master=spark_cluster.master_url),
                         {**env, "PYTHONPATH": str(mod.parent)})
    assert "generated_fns" in line and "ship" in line
    report(f"unshippable module: {secs:.1f} s: {line}")

    # a cluster with no free cores for the executors the job asks for
    line, secs = refused(base + ["--conf", "spark.executor.cores=4", "--executor-timeout", "10"])
    assert spark_cluster.master_url in line and "no executor" in line
    assert secs < 90
    report(f"no free cores: {secs:.1f} s: {line}")


def test_cluster_backfill_under_spark_submit(spark_cluster, kafka_bootstrap, spark, tmp_path, unique, report):
    """``spark-submit --master <cluster> backfill/__main__.py MODULE:ATTR ...`` (spark-submit owns
    the session): the stores equal an in-process ``local[2]`` backfill's of the same history, and
    a ``--conf`` the job is given where spark-submit set the same key loses to spark-submit's."""
    import os
    import sys

    import backfill
    import backfill.__main__ as entry
    from tests.backfill.helpers import _root
    from tests.backfill.test_backfill_failures import SPEC, _diff
    from tests.support.spark_cluster import spark_class

    topics, env = _fk_history(kafka_bootstrap, f"submit-{unique}")
    ref_app, app = f"bfss-ref-{unique}", f"bfss-{unique}"
    backfill.run(apps.fk_aggregate_for(topics["orders"], topics["customers"]), bootstrap_servers=kafka_bootstrap,
                 application_id=ref_app, state_dir=tmp_path / "ref", spark=spark)
    want = without_application_id(contract_column_families(tmp_path / "ref", ref_app), ref_app)

    submit = os.path.join(os.path.dirname(spark_class()), "spark-submit")
    argv = [submit, "--master", spark_cluster.master_url, "--conf", "spark.sql.shuffle.partitions=3",
            "--conf", f"spark.pyspark.python={sys.executable}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            entry.__file__, SPEC, "--bootstrap-servers", kafka_bootstrap, "--application-id", app,
            "--state-dir", str(tmp_path / "state"), "--conf", "spark.sql.shuffle.partitions=5"]
    res = run_cli(argv, env)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-6000:])
    # (spark-submit passes the Python driver's stderr to its stdout)
    assert "spark.sql.shuffle.partitions=5: spark-submit's 3 wins" in res.stdout + res.stderr
    got = without_application_id(contract_column_families(tmp_path / "state", app), app)
    assert got == want, _diff(got, want)
    assert _root() and len(got) == 4 * 3
    report(f"spark-submit on the cluster: {len(got)} task databases equal the local backfill's")
