"""Operational errors of ``processor run`` on a real broker: each ends the worker process with
ONE line on stderr (``processor: error: ...`` naming the thing), no traceback, and the exit code
documented in ``processor.errors``: 3 broker unreachable, 2 missing topic or partition-count
mismatch, 4 state directory locked by another worker, 6 a record that failed processing."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from processor.kafka import clients as kafka
from tests.integration.helpers import produce, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tansu: the first group join waits ~half the session timeout
FAST_GROUP = ["--consumer-config", "session.timeout.ms=6000", "--consumer-config", "heartbeat.interval.ms=500"]


def _env(env):
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return e


def run_args(topology, bootstrap, app, state_dir, *extra):
    return [sys.executable, "-m", "processor.cli", "run", f"tests.integration.apps:{topology}",
            "--bootstrap-servers", bootstrap, "--application-id", app, "--state-dir", str(state_dir), *extra]


def run_worker(args, env, timeout=60):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_env(env))


def assert_exit(proc, code, *fragments) -> str:
    """Exit ``code``; stderr's last non-empty line is the one error line and names every fragment."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith("processor: error: "), proc.stderr[-3000:]
    assert sum(line.startswith("processor: error: ") for line in lines) == 1, proc.stderr[-3000:]
    for f in fragments:
        assert f in last, last
    return last


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    return port


def test_unreachable_broker_exits_3(tmp_path):
    bootstrap = f"127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    p = run_worker(run_args("filter_topology", bootstrap, "app", tmp_path, "--startup-timeout-s", "1"),
                   {"APP_INPUT": "in", "APP_OUTPUT": "out"}, timeout=30)
    elapsed = time.monotonic() - t0
    assert_exit(p, 3, f"cannot reach Kafka at {bootstrap} within 1 s")
    assert elapsed < 10, f"--startup-timeout-s 1 took {elapsed:.1f} s"


def test_missing_source_topic_exits_2(kafka_bootstrap, unique, tmp_path):
    inp, out = f"missing-in-{unique}", f"out-{unique}"
    kafka.create_topics(kafka_bootstrap, {out: 1})
    p = run_worker(run_args("filter_topology", kafka_bootstrap, f"app-{unique}", tmp_path),
                   {"APP_INPUT": inp, "APP_OUTPUT": out})
    last = assert_exit(p, 2, f"topic(s) {inp} do not exist on {kafka_bootstrap}")
    assert out not in last   # only the missing one is named


def test_partition_count_mismatch_exits_2(kafka_bootstrap, unique, tmp_path):
    left, right, out = f"left-{unique}", f"right-{unique}", f"pairs-{unique}"
    kafka.create_topics(kafka_bootstrap, {left: 2, right: 3, out: 1})
    p = run_worker(run_args("table_join_topology", kafka_bootstrap, f"app-{unique}", tmp_path),
                   {"APP_LEFT": left, "APP_RIGHT": right, "APP_OUTPUT": out})
    assert_exit(p, 2, "co-partitioned source topics of sub-topology 0 have different partition counts",
                f"{left}=2, {right}=3")


def test_second_worker_on_a_locked_state_dir_exits_4(kafka_bootstrap, unique, tmp_path):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    state = tmp_path / "state"
    log = tmp_path / "first.log"
    with open(log, "w") as stderr:
        first = subprocess.Popen(run_args("filter_topology", kafka_bootstrap, app, state, *FAST_GROUP),
                                 cwd=ROOT, env=_env(env), stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        wait_for(lambda: "processor.worker: assigned" in log.read_text() or first.poll() is not None,
                 60, "the first worker's assignment", poll_s=0.05)
        assert first.poll() is None, log.read_text()[-3000:]

        t0 = time.monotonic()
        second = run_worker(run_args("filter_topology", kafka_bootstrap, app, state, *FAST_GROUP), env)
        refused_s = time.monotonic() - t0
        assert_exit(second, 4, f"state directory {state / app} is locked by another worker",
                    f"(pid {first.pid} on host {socket.gethostname()})", "--state-dir")
        assert "assigned" not in second.stderr   # refused before it joined the group
        assert first.poll() is None   # the first one is undisturbed

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "processor: error" not in log.read_text()
    assert refused_s < 10


@pytest.mark.parametrize("case", ["user-function", "poison-on-error-fail"])
def test_record_that_fails_processing_exits_6(kafka_bootstrap, unique, tmp_path, case):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    if case == "user-function":   # the filter reads v["amount"] (under dlq, the default, it is dead-lettered)
        produce(kafka_bootstrap, inp, [(b"o1", json.dumps({"amount": 150}).encode()),
                                       (b"o2", json.dumps({"qty": 3}).encode())])
        extra, fragments = ["--on-error", "fail"], [f"record {inp}[0]@1, step KTABLE-FILTER-0000000001: user "
                                                    f"function filter_topology.<locals>.<lambda> (apps.py:",
                                                    "raised KeyError: 'amount'"]
    else:
        produce(kafka_bootstrap, inp, [(b"o1", b"{not json")])
        extra, fragments = ["--on-error", "fail"], [f"record {inp}[0]@0"]
    p = run_worker(run_args("filter_topology", kafka_bootstrap, app, tmp_path, *FAST_GROUP, *extra),
                   {"APP_INPUT": inp, "APP_OUTPUT": out})
    assert_exit(p, 6, *fragments)
