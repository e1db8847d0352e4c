"""Queries across the fleet, the HTTP layer (``processor/runtime/http_endpoint.py``): a UNIT-LEVEL
test of forwarding, redirects, stale reads and the prefix fan-out. Two real Workers (threads of
this pytest process, each with its own HTTP endpoint) count events per key on the real broker;
their ``application_server`` and ``fleet_map`` are set BY HAND from the tasks each runs (the
group wiring that sets them in a deployed fleet is not exercised here: that is
``tests/integration/test_fleet_queries.py``). Worker 0 also keeps standby replicas of worker 1's
tasks (a real ``StandbyTasks`` caught up from the changelogs), set by hand the same way.

What it shows, on ``apps.counts_topology`` (store ``counts``, 4 partitions, 2 tasks per worker):
every key asked at either worker answers 200 with its count (the non-owner relays the owner's
answer, ``served_by`` naming it); ``/metadata`` names the same owner at both; a forwarded
request is not forwarded again (404); ``?redirect=true`` is a 307 to the owner; ``?stale=true``
is answered from a standby where there is one; a prefix scan asked at either worker returns
every key once, in partition order, cut at ``limit``; an owner that does not answer, or no
owner at all, is a 503 naming it (the scan too, unless ``?partial=true``).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from processor.runtime.standby import StandbyTasks
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import produce_with_partitioner, wait_until_tasks_committed

PARTS = 4
KEYS = [f"user-{i:03d}" for i in range(60)]
COUNTS = {k: i % 5 + 1 for i, k in enumerate(KEYS)}


class _HandWiredWorker(Worker):
    """A Worker whose standby replicas the test sets by hand (on a fleet-wired Worker,
    ``standby_tasks`` is a read-only property giving the fleet's own)."""

    standby_tasks = None


def _get(port: int, path: str, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return got


def test_forwarding_redirects_stale_reads_and_the_prefix_fan_out(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                 report):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"fleetq-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    ports = [free_port(), free_port()]
    servers = [f"127.0.0.1:{p}" for p in ports]
    workers = [_HandWiredWorker(apps.counts_topology(), kafka_bootstrap, app, tmp_path / f"w{i}",
                                commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG, http_port=ports[i],
                                http_host="127.0.0.1")
               for i in range(2)]
    threads = [threading.Thread(target=w.run, kwargs={"install_signal_handlers": False}, daemon=True)
               for w in workers]
    for t in threads:
        t.start()
    standby = None
    try:
        _wait(lambda: all(w.ready() and len(w.tasks) == PARTS // 2 for w in workers), 90,
              "both workers ready with 2 tasks each")
        events = [(inp, k.encode(), json.dumps({"n": j}).encode()) for k in KEYS for j in range(COUNTS[k])]
        produce_with_partitioner(kafka_bootstrap, events, "murmur2_random")
        wait_until_tasks_committed(kafka_bootstrap, workers[0].topology, {inp: PARTS}, "read_uncommitted")

        held = [w.queries.call(lambda w=w: sorted(w.tasks)) for w in workers]
        assert sorted(held[0] + held[1]) == [(0, p) for p in range(PARTS)], held
        owner_of = {f"0_{p}": servers[i] for i in range(2) for _, p in held[i]}
        w0 = workers[0]
        standby = StandbyTasks(w0.topology, w0.state_dir, w0.task_manager.restore_consumer_config(),
                               threading.Event())
        w0.standby_tasks = standby   # (no pass runs by itself: caught up once, here)
        w0.queries.call(lambda: (standby.update(held[1]), standby.catch_up()), timeout_s=90)
        fleet = {servers[0]: {"active": held[0], "standby": held[1]},
                 servers[1]: {"active": held[1], "standby": []}}
        for w, s in zip(workers, servers, strict=True):
            w.application_server = s
            w.fleet_map = fleet

        # every key at both workers: the same count; the non-owner relays the owner's answer
        answers = [[_get(port, f"/stores/counts/{k}") for k in KEYS] for port in ports]
        for i in range(2):
            assert [(s, b["key"], b["value"]) for s, b in answers[i]] == [(200, k, COUNTS[k]) for k in KEYS]
            assert [b.get("served_by") for _, b in answers[i]] == [
                None if owner_of[b["task"]] == servers[i] else owner_of[b["task"]] for _, b in answers[i]]
        tasks = [b["task"] for _, b in answers[0]]
        assert tasks == [b["task"] for _, b in answers[1]]
        assert sorted(set(tasks)) == [f"0_{p}" for p in range(PARTS)]
        forwarded = sum(1 for i in range(2) for _, b in answers[i] if "served_by" in b)
        assert forwarded == len(KEYS)   # each key forwarded by exactly one of the two

        # /metadata: the same at both, the owner as active, worker 0 as the standby of worker 1's
        metas = [[_get(port, f"/metadata/counts/{k}") for k in KEYS] for port in ports]
        want = [(200, {"active": owner_of[t], "standbys": [servers[0]] if owner_of[t] == servers[1] else [],
                       "partition": int(t.split("_")[1]), "task": t}) for t in tasks]
        assert metas[0] == metas[1] == want

        k1 = next(k for k, t in zip(KEYS, tasks, strict=True) if owner_of[t] == servers[1])   # worker 1's
        k0 = next(k for k, t in zip(KEYS, tasks, strict=True) if owner_of[t] == servers[0])   # worker 0's
        t1 = tasks[KEYS.index(k1)]
        # a forwarded request is never forwarded again: where the task does not run, 503 (it is moving)
        status, body = _get(ports[1], f"/stores/counts/{k0}", {"X-Processor-Forwarded": "1"})
        assert (status, tasks[KEYS.index(k0)] in body["error"], "served_by" in body) == (503, True, False)
        # ?redirect=true: a 307 to the owner, without the redirect flag
        conn = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=20)
        conn.request("GET", f"/stores/counts/{k1}?redirect=true&stale=false")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Location")) == (307, f"http://{servers[1]}/stores/counts/{k1}?stale=false")
        resp.read()
        conn.close()
        # ?stale=true: worker 0 answers worker 1's key from its standby; worker 1 has none, forwards
        assert _get(ports[0], f"/stores/counts/{k1}?stale=true") == (200, {
            "key": k1, "value": COUNTS[k1], "timestamp": answers[0][KEYS.index(k1)][1]["timestamp"],
            "partition": int(t1.split("_")[1]), "task": t1, "stale": True})
        status, body = _get(ports[1], f"/stores/counts/{k0}?stale=true")
        assert (status, body["value"], body["served_by"], "stale" in body) == (200, COUNTS[k0], servers[0], False)
        # a standby asked (forwarded) for a key it has no row of: 503, never a 404 (no proof of
        # absence); asked by a client, the active answers the 404
        absent = next(k for k in (f"absent-{i}" for i in range(1000))
                      if _get(ports[0], f"/metadata/counts/{k}")[1]["active"] == servers[1])
        status, body = _get(ports[0], f"/stores/counts/{absent}?stale=true", {"X-Processor-Forwarded": "1"})
        assert status == 503 and "no proof" in body["error"], body
        status, body = _get(ports[0], f"/stores/counts/{absent}?stale=true")
        assert (status, body["served_by"], body["hosted_here"]) == (404, servers[1], True), body

        # the prefix fan-out, asked at either worker: every key once, in partition order
        scans = [_get(port, "/stores/counts?prefix=user-") for port in ports]
        assert scans[0] == scans[1]
        entries = scans[0][1]["entries"]
        assert sorted(e["key"] for e in entries) == KEYS
        assert [e["partition"] for e in entries] == sorted(e["partition"] for e in entries)
        assert {e["key"]: e["value"] for e in entries} == COUNTS
        status, first = _get(ports[1], "/stores/counts?prefix=user-&limit=7")
        assert (status, first["entries"]) == (200, entries[:7]) and first["next"], first
        # pages of 7 through the fan-out, asked at either worker in turn: every entry once, in order
        paged, cursor, pages = [], None, 0
        while True:
            status, body = _get(ports[pages % 2], "/stores/counts?prefix=user-&limit=7"
                                + (f"&after={cursor}" if cursor else ""))
            assert status == 200 and len(body["entries"]) <= 7, body
            paged += body["entries"]
            pages += 1
            cursor = body.get("next")
            if cursor is None:
                break
        assert paged == entries and pages >= len(entries) // 7, (pages, [e["key"] for e in paged])
        # each worker's own answer names the partitions it read (all it runs, even past the limit)
        own_parts = _get(ports[1], "/stores/counts?prefix=user-&limit=1", {"X-Processor-Forwarded": "1"})[1]
        assert own_parts["partitions"] == sorted(int(t.split("_")[1]) for t in set(tasks) if owner_of[t] == servers[1])
        assert len(own_parts["entries"]) == 1
        # asked as a forwarded request, a worker answers its own tasks only
        own = _get(ports[1], "/stores/counts?prefix=user-", {"X-Processor-Forwarded": "1"})[1]["entries"]
        assert own == [e for e in entries if owner_of[e["task"]] == servers[1]]

        # worker 1's tasks mapped to a server that does not answer: 503 naming it
        dead = f"127.0.0.1:{free_port()}"
        w0.fleet_map = {servers[0]: {"active": held[0], "standby": []}, dead: {"active": held[1], "standby": []}}
        status, body = _get(ports[0], f"/stores/counts/{k1}")
        assert status == 503 and body["error"].startswith(f"store 'counts': task {t1} is active on {dead}, "
                                                          f"which did not answer"), body
        status, body = _get(ports[0], "/stores/counts?prefix=user-")
        assert status == 503 and f"{dead} did not answer" in body["error"], body
        assert _get(ports[0], "/stores/counts?prefix=user-&partial=true") == (200, {
            "entries": [e for e in entries if owner_of[e["task"]] == servers[0]], "missing": [dead],
            "missing_partitions": sorted(int(t.split("_")[1]) for t in set(tasks) if owner_of[t] == servers[1])})
        # no active for worker 1's tasks at all (moving, restoring): 503 naming the task; the scan
        # names the partitions nobody answered for, never a silently short answer
        w0.fleet_map = {servers[0]: {"active": held[0], "standby": []}}
        nobody = sorted(int(t.split("_")[1]) for t in set(tasks) if owner_of[t] == servers[1])
        status, body = _get(ports[0], "/stores/counts?prefix=user-")
        assert status == 503 and f"no worker runs the task of partition(s) {nobody} now" in body["error"], body
        assert _get(ports[0], "/stores/counts?prefix=user-&partial=true") == (200, {
            "entries": [e for e in entries if owner_of[e["task"]] == servers[0]], "missing": [],
            "missing_partitions": nobody})
        assert _get(ports[0], f"/stores/counts/{k1}") == (503, {
            "error": f"store 'counts': task {t1} (partition {t1.split('_')[1]}) has no active worker in the "
                     f"fleet's assignment"})
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(60)
        if standby is not None:
            standby.close()
    assert not any(t.is_alive() for t in threads)
    report(f"{len(KEYS)} keys over {PARTS} partitions, 2 in-process workers with a hand-set fleet map: every key "
           f"200 with its count at both ({forwarded} answers relayed from the owner), /metadata equal at both, "
           f"the fan-out returned {len(entries)} entries once each")

