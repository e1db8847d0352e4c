"""A rolling restart of a fleet under load, with queries to every worker throughout (issue 36).

Three worker processes (``--num-standby-replicas 1``, each with ``--application-server``) count
events per key over 6 partitions. Events keep arriving while each worker in turn is stopped
(SIGTERM) and started again over its state directory, as a deploy does. Meanwhile a client asks
random keys at random running workers, with ``?stale=true`` (a standby may answer while a task
moves).

What must hold: no query answers 404 (every key asked exists: it was counted before the
restart); the final counts equal the events produced, for every key; each worker ends with 2 of
the 6 tasks, and every task has one standby again. Reported: the answers by status, and the
503s (a task with no copy that could answer, for a moment).
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from tests.integration import apps
from tests.integration.helpers import (
    assigned_partitions_now,
    final_table,
    kill_leftover_workers,
    produce_with_partitioner,
    start_worker_process,
    stop_workers,
    wait_for,
    wait_until_tasks_committed,
    worker_isolation_level,
)

SPEC = "tests.integration.apps:counts_topology"
PARTS = 6
KEYS = [f"k{i:05d}" for i in range(3_000)]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _standby_tasks(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return int(float(re.search(r"^processor_standby_tasks(?:\{[^}]*\})? (\S+)$", text, re.M).group(1)))


def _ask(port: int, key: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stores/counts/{key}?stale=true", timeout=15) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, f"{port}: " + e.read().decode(errors="replace")[:600]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None   # the worker is down (between stop and start): not an answer


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_rolling_restart_under_load_queries_never_404(kafka_bootstrap, broker_capabilities, unique, tmp_path,
                                                      monkeypatch, report, guarantee):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"rolling-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    ports = [free_port() for _ in range(3)]
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    # docs/semantics.md "Isolation level": read_committed under exactly once where the broker
    # completes and hides transactions (a read_uncommitted worker restores an aborted unit's
    # changelog records and commit record: its state counts events whose outputs were aborted),
    # read_uncommitted on Tansu; the outputs are read the same way
    isolation = worker_isolation_level(guarantee, broker_capabilities)

    def start(i):
        return start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                    consumer_config=[f"isolation.level={isolation}"],
                                    extra_args=["--num-standby-replicas", "1", "--http-port", str(ports[i]),
                                                "--application-server", f"127.0.0.1:{ports[i]}"])

    produced: list[tuple[str, bytes, bytes]] = [(inp, k.encode(), b'{"r":0}') for k in KEYS]
    produce_with_partitioner(kafka_bootstrap, produced, "murmur2_random")
    procs = [start(i) for i in range(3)]
    up = [True, True, True]
    stop = threading.Event()
    answers: list[tuple[float, int, int]] = []   # (time, worker, status)
    errors: list[tuple[int, str]] = []

    def load():
        r = 1
        while not stop.is_set():
            batch = [(inp, k.encode(), json.dumps({"r": r}).encode()) for k in random.Random(r).sample(KEYS, 200)]
            produce_with_partitioner(kafka_bootstrap, batch, "murmur2_random")
            produced.extend(batch)
            r += 1
            time.sleep(0.2)

    def query():
        rnd = random.Random(7)
        while not stop.is_set():
            i = rnd.randrange(3)
            if not up[i]:
                continue
            got = _ask(ports[i], rnd.choice(KEYS))
            if got is not None and up[i]:
                answers.append((time.monotonic(), i, got[0]))
                if got[0] != 200:
                    errors.append(got)

    threads = [threading.Thread(target=load, daemon=True), threading.Thread(target=query, daemon=True)]
    try:
        wait_for(lambda: all(len(assigned_partitions_now(open(log).read())) == 2 for log in logs), 120,
                 "2 tasks on each worker", list(zip(procs, logs, strict=True)))
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=120)
        for t in threads:
            t.start()
        time.sleep(3)
        for i in range(3):
            up[i] = False
            procs[i].send_signal(signal.SIGTERM)
            assert procs[i].wait(60) == 0, open(logs[i]).read()[-3000:]
            procs[i] = start(i)
            wait_for(lambda i=i: _ready(ports[i]), 240, f"worker {i} back and ready",
                     list(zip(procs, logs, strict=True)))
            up[i] = True
            time.sleep(4)
        stop.set()
        for t in threads:
            t.join(30)
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180, settled=[out])
        wait_for(lambda: sorted(len(assigned_partitions_now(open(log).read())) for log in logs) == [2, 2, 2], 90,
                 "2 tasks on each worker after the restarts", list(zip(procs, logs, strict=True)))
        # every task has its standby again, on another worker (a task revoked from a worker that
        # keeps it as a standby becomes one)
        wait_for(lambda: sum(_standby_tasks(p) for p in ports) == PARTS, 60, "one standby of every task",
                 list(zip(procs, logs, strict=True)))
        want: dict[bytes, int] = {}
        for _, k, _ in produced:
            want[k] = want.get(k, 0) + 1
        got = {k: json.loads(v) for k, v in final_table(kafka.read_topic(kafka_bootstrap, out,
                                                                          isolation_level=isolation)).items()}
        assert got == want
        stop_workers(procs, logs)
    finally:
        stop.set()
        kill_leftover_workers(procs)
    by_status: dict[int, int] = {}
    for _, _, s in answers:
        by_status[s] = by_status.get(s, 0) + 1
    reasons: dict[str, int] = {}   # the 503s, by what they said
    for status, body in errors:
        if status == 503:
            why = re.sub(r"[0-9_]+|'[^']*'|\([^)]*\)", "", json.loads(body.split(": ", 1)[1])["error"])
            reasons[why] = reasons.get(why, 0) + 1
    report(f"{guarantee} (reading {isolation}): {len(answers)} queries during the rolling restart of 3 workers: "
           f"{sorted(by_status.items())}; "
           f"{len(produced)} events; the 503s: {reasons}")
    assert by_status.get(404, 0) == 0, (by_status, [e for e in errors if e[0] == 404][:5])
    assert by_status.get(200, 0) > 0.75 * len(answers), (by_status, reasons)
