"""The HTTP endpoint secured and bounded (issue 47 item 4), on the broker, with worker PROCESSES
started as users start them (``processor run --http-port ... --http-tls-cert ... --http-auth-token-file
...``), ``apps.http_topology`` (store ``accounts``, string keys):

1. one worker over TLS with a bearer token, logging JSON lines: an unauthenticated client reads
   ``/healthz``, ``/readyz`` and ``/metrics`` and nothing else (401 without a token, 403 with a
   wrong one); pages of a scan (``limit`` + ``next``) return every account exactly once, equal to
   the input; a limit of 10^9 is cut to 10,000; a UTF-8 key, raw or percent-encoded, is found;
   a POST is a JSON 405; 20 clients scanning 10,000 entries each for 10 s leave every probe fast
   and the main loop iterating; clients that go away mid-answer and a 60 KB target leave no
   traceback and no long line in the log, every line of which is JSON.
2. two workers with ``--application-server`` over mutual TLS and a token: a key the other worker
   owns is answered through forwarding (the forwarded request carries the credentials; the other
   worker would refuse it otherwise), the fan-out scan pages through both workers; a client
   certificate alone authenticates, nothing at all is 401.
"""

from __future__ import annotations

import http.client
import json
import random
import signal
import socket
import ssl
import statistics
import threading
import time
import urllib.parse

from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from tests.integration import apps
from tests.integration.helpers import produce_with_partitioner, start_worker_process, wait_until_tasks_committed
from tests.tls import make_tls_files

SPEC = "tests.integration.apps:http_topology"
PARTS = 4
TOKEN = "t0ken-" + "ab12" * 8
REGIONS = ("north", "south", "east", "west")


def _request(port, target, *, token=None, context=None, method="GET", timeout_s=30.0):
    """``(status, JSON body)`` of one request over TLS (``context``)."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout_s, context=context)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        if token is not None:
            conn.putheader("Authorization", f"Bearer {token}")
        conn.endheaders()
        r = conn.getresponse()
        text = r.read().decode()
        return r.status, (json.loads(text) if text.startswith("{") else text)
    finally:
        conn.close()


def _raw(port, target: bytes, context, token=TOKEN):
    """``(status, JSON body)`` of a request whose target is sent as these bytes (raw UTF-8)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as plain, \
            context.wrap_socket(plain, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
                  + token.encode() + b"\r\n\r\n")
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, json.loads(r.read())


def _accounts(n, seed):
    rnd = random.Random(seed)
    out = {f"acct-{i:05d}": {"region": rnd.choice(REGIONS), "balance": rnd.randrange(1000), "ssn": f"{i:09d}",
                             "note": "x" * 300} for i in range(n)}
    out["zoë-ü/1"] = {"region": "north", "balance": 1}
    return out


def _setup(kafka_bootstrap, unique, monkeypatch, accounts):
    inp, out, app = f"accounts-{unique}", f"regions-{unique}", f"https-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    topo = apps.http_topology().for_application(app)
    topics = {inp: PARTS, f"{app}-by-region-repartition": PARTS}
    produce_with_partitioner(kafka_bootstrap, [(inp, k.encode(), json.dumps(v).encode()) for k, v in accounts.items()],
                             "consistent_random")
    return app, topo, topics


def _wait(cond, timeout_s, what, procs):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = cond()
        except OSError:   # not listening yet
            got = None
        if got:
            return got
        for p, log in procs:
            assert p.poll() is None, f"{what}: a worker exited\n" + open(log).read()[-3000:]
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)


def _pages(port, context, limit, token=TOKEN, prefix=""):
    """Every page of a scan: ``(entries, pages)``."""
    entries, cursor, pages = [], None, 0
    while True:
        q = urllib.parse.urlencode({"prefix": prefix, "limit": limit, **({"after": cursor} if cursor else {})})
        status, body = _request(port, f"/stores/accounts?{q}", token=token, context=context)
        assert status == 200 and len(body["entries"]) <= limit, body
        entries += body["entries"]
        pages += 1
        cursor = body.get("next")
        if cursor is None:
            return entries, pages


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


def test_one_worker_over_tls_with_a_token_under_20_scanning_clients(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                    report):
    accounts = _accounts(20_000, seed=21)
    app, topo, topics = _setup(kafka_bootstrap, unique, monkeypatch, accounts)
    tls = make_tls_files(tmp_path / "tls")
    (tmp_path / "token").write_text(TOKEN + "\n")
    port, log = free_port(), tmp_path / "w.log"
    p = start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / "w", log, {"PROCESSOR_LOG_FORMAT": "json"},
                             extra_args=["--http-port", str(port), "--http-tls-cert", str(tls.cert),
                                         "--http-tls-key", str(tls.key), "--http-auth-token-file",
                                         str(tmp_path / "token")])
    procs = [(p, log)]
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    try:
        _wait(lambda: _request(port, "/readyz", context=ctx)[0] == 200, 90, "/readyz 200", procs)
        wait_until_tasks_committed(kafka_bootstrap, topo, topics, "read_uncommitted", timeout_s=120)

        # what a client without credentials reads: the probes and /metrics, nothing else
        open_answers = {t: _request(port, t, context=ctx)[0] for t in ("/healthz", "/readyz", "/metrics")}
        assert open_answers == {"/healthz": 200, "/readyz": 200, "/metrics": 200}
        refused = {t: _request(port, t, context=ctx) for t in (
            "/stores/accounts/acct-00001", "/stores/accounts?prefix=", "/metadata/accounts/acct-00001",
            "/stores/by-region/north")}
        assert {t: s for t, (s, _) in refused.items()} == dict.fromkeys(refused, 401), refused
        assert not any("ssn" in json.dumps(b) for _, b in refused.values())
        assert _request(port, "/stores/accounts/acct-00001", token="wrong", context=ctx)[0] == 403
        status, body = _request(port, "/stores/accounts/acct-00001", token=TOKEN, context=ctx)
        assert (status, body["value"]) == (200, accounts["acct-00001"])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:   # plain HTTP: no answer
            s.sendall(b"GET /stores/accounts/acct-00001 HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                got = s.recv(65536)
            except ConnectionResetError:
                got = b""
            assert b"acct" not in got

        # pages: every account once, in order; a limit of 10^9 cut to 10,000
        paged, pages = _pages(port, ctx, 3000)
        assert [e["key"] for e in paged].count("acct-00001") == 1
        assert {e["key"]: e["value"] for e in paged} == accounts and len(paged) == len(accounts)
        assert [e["partition"] for e in paged] == sorted(e["partition"] for e in paged)
        assert pages == -(-len(accounts) // 3000)
        status, body = _request(port, "/stores/accounts?limit=1000000000", token=TOKEN, context=ctx)
        assert status == 200 and len(body["entries"]) == 10_000 and body["next"]
        # a UTF-8 key, raw and percent-encoded; JSON 405 for another method
        for target in ("/stores/accounts/zoë-ü%2F1".encode(), b"/stores/accounts/zo%C3%AB-%C3%BC%2F1"):
            status, body = _raw(port, target, ctx)
            assert (status, body["key"]) == (200, "zoë-ü/1"), body
        status, body = _request(port, "/stores/accounts/acct-00001", method="POST", token=TOKEN, context=ctx)
        assert status == 405 and "GET only" in body["error"]
        status, body = _request(port, "/stores/accounts/" + "x" * 60_000, token=TOKEN, context=ctx)
        assert status == 414

        # 20 clients scan 10,000 entries each, again and again, for 10 s; a probe every 0.1 s
        stop = threading.Event()
        scans: list[tuple[int, float]] = []
        probes: list[tuple[int, float]] = []
        loop_ages: list[float] = []

        def scanner():   # (the answer read, not parsed: the probes share this process)
            while not stop.is_set():
                t0 = time.monotonic()
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=ctx)
                conn.request("GET", "/stores/accounts?limit=1000000000", headers={"Authorization": f"Bearer {TOKEN}"})
                r = conn.getresponse()
                size = len(r.read())
                conn.close()
                scans.append((r.status, time.monotonic() - t0))
                sizes.append(size)

        def prober():
            while not stop.is_set():
                t0 = time.monotonic()
                status, _ = _request(port, "/healthz", context=ctx, timeout_s=10)
                probes.append((status, time.monotonic() - t0))
                stop.wait(0.1)

        def loop_age():
            while not stop.is_set():
                text = _request(port, "/metrics", context=ctx, timeout_s=10)[1]
                loop_ages.extend(float(line.split()[-1]) for line in text.splitlines()
                                 if line.startswith("processor_main_loop_age_seconds "))
                stop.wait(0.3)

        sizes: list[int] = []
        threads = [threading.Thread(target=scanner) for _ in range(20)]
        threads += [threading.Thread(target=prober), threading.Thread(target=loop_age)]
        for t in threads:
            t.start()
        time.sleep(10)
        stop.set()
        for t in threads:
            t.join(90)
        probe_s = sorted(s for _, s in probes)
        assert {s for s, _ in probes} == {200} and len(probes) >= 30, probes
        assert {s for s, _ in scans} <= {200, 503} and sum(1 for s, _ in scans if s == 200) >= 20, scans
        assert min(sizes) > 10_000 * 300   # (10,000 entries of ~350 bytes each)
        # generous bounds for a loaded CI machine (Kubernetes' probe timeout is 1 s; measured here:
        # report below; benchmarks/http_probes.py measures it): before, the loop was held 20 s
        assert probe_s[len(probe_s) // 2] < 0.5 and probe_s[-1] < 3.0, probe_s[-10:]
        assert max(loop_ages) < 5.0, sorted(loop_ages)[-5:]

        # clients that go away mid-answer
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as plain, \
                    ctx.wrap_socket(plain, server_hostname="127.0.0.1") as s:
                s.sendall(b"GET /stores/accounts?limit=10000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                          + TOKEN.encode() + b"\r\n\r\n")
                s.recv(100)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")   # reset
        assert _request(port, "/healthz", context=ctx)[0] == 200
    finally:
        _stop(procs)
    lines = open(log).read().splitlines()
    not_json = [line for line in lines if not line.startswith("{")]
    assert not not_json and not any("Traceback" in line for line in lines), not_json[:20]
    assert max(len(line) for line in lines) < 4000   # (the 60 KB target never reaches the log)
    for line in lines:
        json.loads(line)
    ok = [s for st, s in scans if st == 200]
    report(f"one worker over TLS with a token, {len(accounts)} accounts: unauthenticated 200 on /healthz /readyz "
           f"/metrics only (401 on /stores /metadata, 403 with a wrong token); {pages} pages of 3000 = every account "
           f"once; under 20 clients scanning 10,000 entries each ({len(ok)} scans answered, median "
           f"{statistics.median(ok):.2f} s): {len(probes)} /healthz probes median "
           f"{statistics.median(probe_s) * 1000:.0f} ms, max {probe_s[-1] * 1000:.0f} ms; main loop age max "
           f"{max(loop_ages):.2f} s; {len(lines)} log lines, all JSON, no traceback")


def test_two_workers_forward_with_their_credentials_over_mutual_tls(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                    report):
    accounts = _accounts(2000, seed=22)
    app, topo, topics = _setup(kafka_bootstrap, unique, monkeypatch, accounts)
    tls = make_tls_files(tmp_path / "tls")
    (tmp_path / "token").write_text(TOKEN + "\n")
    ports = [free_port(), free_port()]
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    procs = [start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], {}, extra_args=[
        "--http-port", str(ports[i]), "--application-server", f"127.0.0.1:{ports[i]}",
        "--http-tls-cert", str(tls.cert), "--http-tls-key", str(tls.key), "--http-tls-client-ca", str(tls.ca),
        "--http-tls-ca", str(tls.ca), "--http-auth-token-file", str(tmp_path / "token")]) for i in range(2)]
    running = list(zip(procs, logs, strict=True))
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    with_cert = ssl.create_default_context(cafile=str(tls.ca))
    with_cert.load_cert_chain(str(tls.cert), str(tls.key))
    try:
        def split():
            ms = [_request(port, "/metrics", context=ctx)[1] for port in ports]
            return all("processor_ready 1.0" in m and "processor_assigned_tasks 4.0" in m for m in ms)

        _wait(split, 120, "both workers ready with half the tasks each", running)
        wait_until_tasks_committed(kafka_bootstrap, topo, topics, "read_uncommitted", timeout_s=120)
        sample = sorted(random.Random(5).sample(sorted(accounts), 60))
        forwarded = 0
        for k in sample:
            target = "/stores/accounts/" + urllib.parse.quote(k, safe="")
            status, body = _request(ports[0], target, token=TOKEN, context=ctx)
            assert (status, body["value"]) == (200, accounts[k]), (k, body)
            forwarded += "served_by" in body
            assert _request(ports[0], target, context=ctx)[0] == 401
            # a client certificate alone authenticates (mutual TLS)
            assert _request(ports[1], target, context=with_cert)[1]["value"] == accounts[k]
        assert 0 < forwarded < len(sample)   # some keys owned by worker 1, answered through worker 0
        # the forwarded request needs the credentials: asked without them, worker 1 refuses it
        status, _ = _request(ports[1], "/stores/accounts?prefix=", context=ctx)
        assert status == 401
        # the fan-out scan in pages, asked at worker 0: every account once
        paged, pages = _pages(ports[0], ctx, 500)
        assert {e["key"]: e["value"] for e in paged} == accounts and len(paged) == len(accounts)
        status, body = _request(ports[0], "/metadata/accounts/acct-00001", token=TOKEN, context=ctx)
        assert status == 200 and body["active"] in {f"127.0.0.1:{p}" for p in ports}
    finally:
        _stop(running)
    for log in logs:
        text = open(log).read()
        assert "reaches this worker's HTTP endpoint" in text, text[-3000:]   # the advertised-address probe over TLS
    report(f"two workers over mutual TLS with a token: {len(sample)} keys asked at worker 0, {forwarded} forwarded to "
           f"worker 1 with the credentials; none without them (401); a client certificate alone answered; the "
           f"fan-out scan in {pages} pages of 500 = all {len(accounts)} accounts once")
