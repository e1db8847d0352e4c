"""Queries across the fleet, end to end (issue 36 point 4): two worker PROCESSES, started as users
start them (``processor run --http-port P --application-server 127.0.0.1:P``), count events per
key (``apps.counts_topology``, store ``counts``); their group assignment gives each the fleet map
(``worker.fleet_map``: every member's server and tasks), so either worker answers any key:

- every key, asked at BOTH workers, answers 200 with the same count (the one that does not run
  its task forwards to the one that does), equal to the count of events produced;
- ``/metadata/counts/<key>`` names the same active at both, one of the two servers, and that
  server answers the key itself (no ``served_by``);
- a prefix scan asked at either worker returns every key exactly once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from tests.integration import apps
from tests.integration.helpers import produce_with_partitioner, start_worker_process, wait_until_tasks_committed

SPEC = "tests.integration.apps:counts_topology"
PARTS = 4
KEYS = [f"user-{i:03d}" for i in range(200)]
COUNTS = {k: i % 7 + 1 for i, k in enumerate(KEYS)}



def _get(port: int, path: str) -> tuple[int, dict] | None:
    """``(status, JSON body)``, None while the worker is not listening yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (urllib.error.URLError, ConnectionError):
        return None


def _wait(cond, timeout_s: float, what: str, procs):
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        for p, log in procs:
            assert p.poll() is None, f"{what}: a worker exited\n" + open(log).read()[-3000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return got


def test_any_worker_answers_any_key(kafka_bootstrap, unique, tmp_path, monkeypatch, report):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"fleetq-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    ports = [free_port(), free_port()]
    servers = [f"127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [(start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], {},
                                   extra_args=["--http-port", str(ports[i]), "--application-server", servers[i]]),
              logs[i]) for i in range(2)]
    try:
        _wait(lambda: all((_get(port, "/readyz") or (0,))[0] == 200 for port in ports), 90, "both workers ready",
              procs)
        events = [(inp, k.encode(), json.dumps({"n": j}).encode()) for k in KEYS for j in range(COUNTS[k])]
        produce_with_partitioner(kafka_bootstrap, events, "murmur2_random")
        topo = apps.counts_topology().for_application(app)
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, "read_uncommitted", timeout_s=120)

        # the assignment reached both: every task has an active named at both workers
        def placed():
            metas = [[_get(port, f"/metadata/counts/{k}") for k in KEYS] for port in ports]
            return metas if metas[0] == metas[1] and all(m and m[1]["active"] for m in metas[0]) else None

        metas = _wait(placed, 60, "/metadata names an active for every key at both workers", procs)
        actives = [b["active"] for _, b in metas[0]]
        assert sorted(set(actives)) == sorted(servers)   # both run tasks, and no other server is named
        assert [s for s, _ in metas[0]] == [200] * len(KEYS)

        answers = [[_get(port, f"/stores/counts/{k}") for k in KEYS] for port in ports]
        for i in range(2):
            assert [(s, b["key"], b["value"]) for s, b in answers[i]] == [(200, k, COUNTS[k]) for k in KEYS]
            # answered here when this worker is the active, else relayed from the active
            assert [b.get("served_by") for _, b in answers[i]] == [None if a == servers[i] else a for a in actives]

        for port in ports:
            status, body = _get(port, "/stores/counts?prefix=user-&limit=100000")
            assert status == 200, body
            assert sorted(e["key"] for e in body["entries"]) == KEYS   # every key, exactly once
            assert {e["key"]: e["value"] for e in body["entries"]} == COUNTS
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, log in procs:
            try:
                assert p.wait(60) == 0, open(log).read()[-3000:]
            finally:
                if p.poll() is None:
                    p.kill()
    report(f"{len(KEYS)} keys, 2 worker processes: every key 200 with its count at both "
           f"({sum(a != servers[0] for a in actives)} of them active on {servers[1]}), /metadata equal at both, "
           f"both scans returned every key once")
