"""The worker's HTTP endpoint (issue 15 item 1) on a real broker, with worker PROCESSES started as
users start them (``processor run --http-port``), ``apps.http_topology`` (a table of accounts,
store ``accounts``, aggregated per region into ``by-region`` through a repartition topic):

1. one worker: ``/metrics`` moves as records flow and, drained, its counters equal what the
   input implies (every account update read once by the table source, every record processed
   counted once per task) with no lag left; every account and region read through
   ``/stores/<store>/<key>`` (and a prefix scan) equals a from-scratch computation over the
   input; ``/healthz`` turns 503 while a user function hangs and 200 after it returns;
2. two workers: every key asked (a sample) is answered 200 by exactly one of them and 404 by the
   other, the 404 naming the partition the 200 came from (and their scans split the whole
   table); a worker restarted on a wiped state directory answers ``/readyz`` 503 while it
   restores (``/metrics`` showing the restore) and 200 after.
"""

import json
import random
import shutil
import signal
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from tests.integration import apps
from tests.integration.helpers import produce_with_partitioner, start_worker_process, wait_until_tasks_committed

SPEC = "tests.integration.apps:http_topology"
PARTS = 4
REGIONS = ("north", "south", "east", "west", "centre")


def _get(port, path, timeout_s=15.0):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            body = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read(), e.code
    text = body.decode()
    return status, (json.loads(text) if text.startswith(("{", "[")) else text)


def _status(port, path) -> int | None:
    """The status of ``path``, None while the worker is not listening yet."""
    try:
        return _get(port, path, timeout_s=2)[0]
    except (urllib.error.URLError, ConnectionError):
        return None


def _metrics(port) -> dict:
    """``{(name, frozenset(labels)): value}`` of one scrape."""
    status, text = _get(port, "/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _sum(metrics, name, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))


def _updates(n, accounts, seed):
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        k = f"acct-{rnd.randrange(accounts):04d}"
        out.append((k.encode(), json.dumps({"region": rnd.choice(REGIONS), "balance": rnd.randrange(1000)}).encode()))
    return out


def _expected(updates):
    accounts = {}
    for k, v in updates:
        accounts[k.decode()] = json.loads(v)
    regions = {}
    for a in accounts.values():
        r = regions.setdefault(a["region"], {"accounts": 0, "balance": 0})
        r["accounts"] += 1
        r["balance"] += a["balance"]
    return accounts, regions


def _wait(cond, timeout_s, what, procs=()):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        for p, log in procs:
            assert p.poll() is None, f"{what}: a worker exited\n" + open(log).read()[-3000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


def _setup(kafka_bootstrap, unique, monkeypatch):
    inp, out, app = f"accounts-{unique}", f"regions-{unique}", f"http-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    topo = apps.http_topology().for_application(app)
    topics = {inp: PARTS, f"{app}-by-region-repartition": PARTS}
    return inp, app, topo, topics


def _stop(procs):
    for p, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p, log in procs:
        try:
            assert p.wait(60) == 0, open(log).read()[-3000:]
        finally:
            if p.poll() is None:
                p.kill()


def test_metrics_queries_and_health_of_one_worker(kafka_bootstrap, unique, tmp_path, monkeypatch, report):
    inp, app, topo, topics = _setup(kafka_bootstrap, unique, monkeypatch)
    port, log = free_port(), tmp_path / "w.log"
    p = start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / "w", log, {},
                             extra_args=["--http-port", str(port), "--health-timeout-s", "3"])
    procs = [(p, log)]
    try:
        _wait(lambda: _status(port, "/readyz") == 200, 60, "/readyz 200", procs)
        before = _metrics(port)
        assert _sum(before, "processor_records_processed_total") == 0
        assert _get(port, "/healthz")[0] == 200

        updates = _updates(3000, 400, seed=11)
        produce_with_partitioner(kafka_bootstrap, [(inp, k, v) for k, v in updates], "consistent_random")
        wait_until_tasks_committed(kafka_bootstrap, topo, topics, "read_uncommitted", timeout_s=120)
        # the snapshot is published about once a second
        m = _wait(lambda: (lambda m: m if _sum(m, "processor_task_events_total", operator="task", event="processed")
                           == _sum(m, "processor_records_processed_total") > 0 and
                           _sum(m, "processor_consumer_lag_records") == 0 else None)(_metrics(port)),
                  20, "metrics settle", procs)
        processed = _sum(m, "processor_records_processed_total")
        source_in = _sum(m, "processor_task_events_total", operator="KTABLE-SOURCE-0000000000", event="records_in")
        agg_in = _sum(m, "processor_task_events_total", operator="KTABLE-AGGREGATE-0000000004", event="records_in")
        assert source_in == len(updates), (source_in, len(updates))
        assert processed == source_in + agg_in, (processed, source_in, agg_in)
        assert _sum(m, "processor_commit_latency_seconds_count") > 0
        assert _sum(m, "processor_ready") == 1 and _sum(m, "processor_assigned_tasks") == 2 * PARTS
        assert _sum(m, "process_resident_memory_bytes") > 0

        accounts, regions = _expected(updates)
        got_accounts = {}
        for k in sorted(accounts):
            status, body = _get(port, f"/stores/accounts/{k}")
            assert status == 200, (k, body)
            got_accounts[k] = body["value"]
        assert got_accounts == accounts
        got_regions = {}
        for r in REGIONS:
            status, body = _get(port, f"/stores/by-region/{r}")
            assert status == 200, (r, body)
            got_regions[r] = body["value"]
        assert got_regions == regions
        status, body = _get(port, "/stores/accounts?prefix=acct-00")
        assert status == 200
        assert sorted(e["key"] for e in body["entries"]) == sorted(k for k in accounts if k.startswith("acct-00"))
        status, body = _get(port, "/stores/accounts/no-such-account")
        assert status == 404 and body.get("hosted_here") is True, body
        assert _get(port, "/stores/nope/x")[0] == 404

        # a user function that hangs for 8 s: /healthz 503 (timeout 3 s) while it does, then 200
        produce_with_partitioner(kafka_bootstrap, [(inp, b"acct-9999", json.dumps(
            {"region": "north", "balance": 1, "sleep_s": 8}).encode())], "consistent_random")
        t0 = time.monotonic()
        status, body = _wait(lambda: (lambda r: r if r[0] == 503 else None)(_get(port, "/healthz")),
                             15, "/healthz 503 during the hang", procs)
        stuck_after = time.monotonic() - t0
        assert body["main_loop_age_s"] > 3
        assert _get(port, "/readyz")[0] == 503
        _wait(lambda: _get(port, "/healthz")[0] == 200, 20, "/healthz 200 after the hang", procs)
        recovered_after = time.monotonic() - t0
        status, body = _get(port, "/stores/accounts/acct-9999")
        assert status == 200 and body["value"]["sleep_s"] == 8
    finally:
        _stop(procs)
    report(f"one worker: {len(updates)} updates, {int(processed)} records processed ({int(source_in)} by the "
           f"table source, {int(agg_in)} by the aggregation), lag 0; {len(accounts)} accounts and {len(regions)} "
           f"regions read over HTTP equal the from-scratch tables; /healthz 503 {stuck_after:.1f} s into an 8 s "
           f"hang (timeout 3 s), 200 again {recovered_after:.1f} s in")


def test_two_workers_answer_their_keys_and_readyz_follows_a_restore(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                    report):
    inp, app, topo, topics = _setup(kafka_bootstrap, unique, monkeypatch)
    ports = [free_port(), free_port()]
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    states = [tmp_path / "w0", tmp_path / "w1"]

    def start(i, env=None):
        return start_worker_process(kafka_bootstrap, SPEC, app, states[i], logs[i], env or {},
                                    extra_args=["--http-port", str(ports[i])])

    procs = [start(0), start(1)]
    try:
        def split_assignment():
            if any(_status(port, "/healthz") is None for port in ports):
                return False
            ms = [_metrics(port) for port in ports]
            return all(_sum(m, "processor_ready") == 1 for m in ms) and \
                [_sum(m, "processor_assigned_tasks") for m in ms] == [PARTS, PARTS]

        _wait(split_assignment, 90, "both workers ready with half the tasks each", list(zip(procs, logs, strict=False)))
        updates = _updates(20000, 2000, seed=12)
        produce_with_partitioner(kafka_bootstrap, [(inp, k, v) for k, v in updates], "consistent_random")
        wait_until_tasks_committed(kafka_bootstrap, topo, topics, "read_uncommitted", timeout_s=120)
        accounts, regions = _expected(updates)

        def answers(store, keys):
            """``{key: (value, owning partition)}``, asserting one 200 and one 404 naming it."""
            out = {}
            for k in keys:
                (s0, b0), (s1, b1) = [_get(port, f"/stores/{store}/{k}") for port in ports]
                assert sorted([s0, s1]) == [200, 404], (k, s0, b0, s1, b1)
                ok, other = (b0, b1) if s0 == 200 else (b1, b0)
                assert other["partition"] == ok["partition"] and other["task"] == ok["task"], (k, ok, other)
                out[k] = (ok["value"], ok["partition"])
            return out

        sample = sorted(random.Random(3).sample(sorted(accounts), 200))
        got = answers("accounts", sample)
        assert {k: v for k, (v, _) in got.items()} == {k: accounts[k] for k in sample}
        assert len({p for _, p in got.values()}) == PARTS
        # every account, from the two workers' scans: disjoint, together the whole table
        scans = [_get(port, "/stores/accounts?limit=100000")[1]["entries"] for port in ports]
        assert not {e["key"] for e in scans[0]} & {e["key"] for e in scans[1]}
        assert {e["key"]: e["value"] for sc in scans for e in sc} == accounts
        got_regions = answers("by-region", REGIONS)
        assert {k: v for k, (v, _) in got_regions.items()} == regions

        # worker 1 stops, its state goes, it comes back with a slowed restore
        procs[1].send_signal(signal.SIGTERM)
        assert procs[1].wait(60) == 0
        shutil.rmtree(states[1])
        procs[1] = start(1, {"PROCESSOR_TEST_RESTORE_STEP_DELAY_MS": "400"})
        seen, restoring_metric = [], 0.0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert procs[1].poll() is None, open(logs[1]).read()[-3000:]
            if _status(ports[1], "/healthz") is None:
                time.sleep(0.1)   # not listening yet
                continue
            status, body = _get(ports[1], "/readyz")
            if status == 503 and body.get("restoring"):
                seen.append("restoring")
                m = _metrics(ports[1])
                restoring_metric = max(restoring_metric, _sum(m, "processor_restoring_tasks"))
            elif status == 200 and "restoring" in seen:
                seen.append("ready")
                break
            time.sleep(0.05)
        assert seen and seen[0] == "restoring" and seen[-1] == "ready", seen
        assert restoring_metric > 0
        wait_until_tasks_committed(kafka_bootstrap, topo, topics, "read_uncommitted", timeout_s=120)
        again = answers("accounts", sample)
        assert {k: v for k, (v, _) in again.items()} == {k: accounts[k] for k in sample}
    finally:
        _stop(list(zip(procs, logs, strict=False)))
    report(f"two workers: {len(accounts)} accounts over {PARTS} partitions and {len(regions)} regions, each answered "
           f"200 by its owner and 404 naming the owner's partition by the other, values equal the from-scratch "
           f"tables (200 keys one by one, all {len(accounts)} by the two workers' scans); "
           f"a wiped worker's /readyz: 503 "
           f"with tasks restoring in {seen.count('restoring')} polls (up to {int(restoring_metric)} tasks restoring in "
           f"/metrics), then 200, and it answers again")
