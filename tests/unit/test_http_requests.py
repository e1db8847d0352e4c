"""The HTTP endpoint's request handling (issue 47 item 4), on real local sockets with a stand-in
worker (the routes that read stores are tested on the broker: tests/integration/
test_http_endpoint.py): request targets read as UTF-8, log lines with the target cut and
escaped, JSON for every error and method, no server version, the credentials asked of each
route (a token, a client certificate over TLS), the address the endpoint binds, cursors."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from processor.errors import ConfigError
from processor.runtime.http_endpoint import (
    INSTANCE,
    LOGGED_TARGET_CHARS,
    MAX_TARGET,
    HTTPRefusal,
    WorkerHTTPEndpoint,
    loggable,
    parse_target,
)
from processor.runtime.http_security import HTTPSecurity, default_bind_host
from processor.runtime.interactive_queries import Cursor, QueryError
from tests.tls import make_tls_files

TOKEN = "s3cret-token-0123456789"


def stub_worker():
    return SimpleNamespace(metrics_state=SimpleNamespace(loop_beat=time.monotonic(), snapshot={}),
                           metrics_registry=CollectorRegistry(), ready=lambda: True)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def serve(security=None):
    return WorkerHTTPEndpoint(stub_worker(), 0, "127.0.0.1", security=security).start()


def request(port, method, target, headers=None, context=None, body=None):
    """``(status, headers, JSON body or text)`` of one request (the target sent as given: bytes
    for raw non-ASCII)."""
    if isinstance(target, bytes):   # (http.client sends ASCII only)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(method.encode() + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            r = http.client.HTTPResponse(s)
            r.begin()
            text = r.read().decode()
            return r.status, r.headers, (json.loads(text) if text.startswith("{") else text)
    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context) if context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        raw = r.read()
        text = raw.decode()
        return r.status, r.headers, (json.loads(text) if text.startswith("{") else text)
    finally:
        conn.close()


# -- request targets ------------------------------------------------------------------------------

def test_targets_are_read_as_utf_8_raw_or_percent_encoded():
    raw = "/stores/accounts/zoë/ü".encode().decode("latin-1")   # as http.server hands it over
    for target in (raw, "/stores/accounts/zo%C3%AB%2F%C3%BC", "/stores/accounts/zo%C3%AB/%C3%BC"):
        t = parse_target(target)
        assert (t.route, t.store, t.key) == ("stores", "accounts", "zoë/ü"), target
    t = parse_target("/stores/accounts?prefix=%C3%A9t%C3%A9&limit=5&after=0.YQ")
    assert (t.store, t.key, t.query) == ("accounts", None, {"prefix": ["été"], "limit": ["5"], "after": ["0.YQ"]})
    assert parse_target("/healthz/").path == "/healthz"
    for bad in ("/stores/a/%FF%FE", b"/stores/a/\xff".decode("latin-1"), "/stores/a?prefix=%C3"):
        with pytest.raises(HTTPRefusal) as exc:
            parse_target(bad)
        assert exc.value.status == 400
    with pytest.raises(HTTPRefusal) as exc:
        parse_target("/stores/a/" + "x" * MAX_TARGET)
    assert exc.value.status == 414


def test_a_logged_target_is_cut_and_escaped():
    assert loggable("/healthz") == "/healthz"
    shown = loggable("/stores/x/" + "\x1b[31m" + "é" * 70_000)
    assert shown.startswith("/stores/x/\\x1b[31m\\xe9") and shown.endswith("... (70015 characters)")
    assert len(shown) < LOGGED_TARGET_CHARS * 4 + 40 and "\x1b" not in shown


def test_cursors_round_trip_and_bad_ones_are_refused():
    for c in (Cursor(3, b"acct-\x00\xff/"), Cursor(None, b""), Cursor(0, "zoë".encode())):
        text = str(c)
        assert text.isascii() and "=" not in text and "/" not in text and "+" not in text
        assert Cursor.parse(text) == c
    for bad in ("", "3", "x.YQ", "-1.YQ", "3.*"):
        with pytest.raises(QueryError):
            Cursor.parse(bad)


# -- answers ----------------------------------------------------------------------------------------

def test_every_error_and_method_is_answered_in_json_without_a_version(caplog):
    ep = serve()
    try:
        for method in ("POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW"):
            status, headers, body = request(ep.port, method, "/healthz")
            assert status == 405 and headers["Allow"] == "GET", (method, status, body)
            assert headers["Content-Type"] == "application/json" and headers[INSTANCE] == ep.instance
            assert headers["Server"] == "processor"
            if method != "HEAD":
                assert "GET only" in body["error"], body
        status, headers, body = request(ep.port, "GET", "/no/such/route")
        assert status == 404 and headers["Server"] == "processor" and "no route" in body["error"]
        status, _, body = request(ep.port, "GET", "/healthz", body=b"{}")
        assert status == 413 and "no body" in body["error"]
        status, _, body = request(ep.port, "GET", "/stores/a/" + "x" * MAX_TARGET)
        assert status == 414 and body["error"]
        status, _, body = request(ep.port, "GET", b"/stores/a/\xff")
        assert status == 400 and "UTF-8" in body["error"]
        with socket.create_connection(("127.0.0.1", ep.port), timeout=10) as s:   # not HTTP at all
            s.sendall(b"NONSENSE\r\n\r\n")
            chunks = []
            while chunk := s.recv(65536):   # (to the server's close: headers and body may come apart)
                chunks.append(chunk)
            reply = b"".join(chunks).decode()
        assert reply.startswith("HTTP/1.1 400 ") and reply.rstrip().endswith('"}'), reply
        status, _, body = request(ep.port, "GET", "/healthz")
        assert status == 200 and body["status"] == "ok"
        # a non-UTF-8 target in a 404 route answer, and in the access log, is escaped and cut
        caplog.set_level(logging.DEBUG, logger="processor.http")
        status, _, body = request(ep.port, "GET", "/nope/" + "%C3%A9" * 1000)
        assert status == 404 and len(body["error"]) < 1000
        # a route that fails (the stand-in has no topology): 500 in JSON, one WARNING line, target cut
        status, _, body = request(ep.port, "GET", "/stores/accounts/" + "k" * 6000)
        assert status == 500 and body["error"].startswith("AttributeError"), body
        lines = [r.getMessage() for r in caplog.records if r.name == "processor.http"]
        assert lines and all(len(line) < LOGGED_TARGET_CHARS * 4 + 200 for line in lines), lines
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "(6017 characters)" in warned[0], warned
    finally:
        ep.stop()


def test_the_probes_are_open_and_the_data_routes_ask_for_the_token(token_file):
    ep = serve(HTTPSecurity(auth_token_file=token_file))
    try:
        assert request(ep.port, "GET", "/healthz")[0] == 200
        assert request(ep.port, "GET", "/readyz")[0] == 200
        assert request(ep.port, "GET", "/metrics")[0] == 200   # open unless --http-metrics-auth
        for target in ("/stores/accounts/alice", "/stores/accounts?prefix=", "/metadata/accounts/alice"):
            status, headers, body = request(ep.port, "GET", target)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), (target, body)
            assert request(ep.port, "GET", target, {"Authorization": "Bearer wrong"})[0] == 403
            assert request(ep.port, "GET", target, {"Authorization": "Basic " + TOKEN})[0] == 401
            # the right token passes (the stand-in worker has no stores: not 401/403)
            assert request(ep.port, "GET", target, {"Authorization": f"Bearer {TOKEN}"})[0] not in (401, 403)
    finally:
        ep.stop()
    ep = serve(HTTPSecurity(auth_token_file=token_file, metrics_auth=True))
    try:
        assert request(ep.port, "GET", "/metrics")[0] == 401
        assert request(ep.port, "GET", "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert request(ep.port, "GET", "/healthz")[0] == 200
    finally:
        ep.stop()


def test_tls_and_client_certificates(tmp_path, token_file):
    files = make_tls_files(tmp_path / "tls")
    sec = HTTPSecurity(tls_cert=str(files.cert), tls_key=str(files.key), tls_client_ca=str(files.ca),
                       tls_ca=str(files.ca))
    ep = serve(sec)
    trusting = ssl.create_default_context(cafile=str(files.ca))
    with_cert = ssl.create_default_context(cafile=str(files.ca))
    with_cert.load_cert_chain(str(files.cert), str(files.key))
    with_other = ssl.create_default_context(cafile=str(files.ca))
    with_other.load_cert_chain(str(files.other_cert), str(files.other_key))
    try:
        # the probes over TLS without a client certificate; plain HTTP is not answered
        assert request(ep.port, "GET", "/healthz", context=trusting)[0] == 200
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            request(ep.port, "GET", "/healthz")
        # a client that does not trust the endpoint's CA refuses it
        with pytest.raises(ssl.SSLCertVerificationError):
            request(ep.port, "GET", "/healthz", context=ssl.create_default_context())
        # the data routes: no certificate 401; a certificate of the client CA passes
        status, _, body = request(ep.port, "GET", "/stores/accounts/alice", context=trusting)
        assert status == 401 and "client certificate" in body["error"]
        assert request(ep.port, "GET", "/stores/accounts/alice", context=with_cert)[0] not in (401, 403)
        # a certificate of another CA: refused by the handshake
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            request(ep.port, "GET", "/stores/accounts/alice", context=with_other)
        # the endpoint is still up and its own client context (forwarding) is accepted
        assert request(ep.port, "GET", "/stores/accounts/alice", context=sec.client_context)[0] not in (401, 403)
    finally:
        ep.stop()


def test_settings_are_checked_once(tmp_path, token_file):
    files = make_tls_files(tmp_path / "tls")
    with pytest.raises(ConfigError, match="go together"):
        HTTPSecurity(tls_cert=str(files.cert))
    with pytest.raises(ConfigError, match="need TLS"):
        HTTPSecurity(tls_client_ca=str(files.ca))
    with pytest.raises(ConfigError, match="needs a credential"):
        HTTPSecurity(metrics_auth=True)
    with pytest.raises(ConfigError, match="cannot read"):
        HTTPSecurity(auth_token_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="one line"):
        HTTPSecurity(auth_token_file=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="--http-tls-cert"):
        HTTPSecurity(tls_cert=str(files.cert), tls_key=str(files.other_key))   # a key of another certificate
    assert HTTPSecurity(auth_token_file=token_file).peer_headers() == {"Authorization": f"Bearer {TOKEN}"}


def test_the_endpoint_binds_loopback_unless_asked(token_file):
    assert default_bind_host(None) == "127.0.0.1"
    for local in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"):
        assert default_bind_host(local) == "127.0.0.1", local
    for other in ("worker-1:8080", "10.0.0.5:8080", "worker-1.svc.cluster.local:8080"):
        assert default_bind_host(other) == "0.0.0.0", other
    assert "answer anyone" in HTTPSecurity().exposure_warning("0.0.0.0", 8080)
    assert "clear text" in HTTPSecurity(auth_token_file=token_file).exposure_warning("0.0.0.0", 8080)
    assert HTTPSecurity().exposure_warning("127.0.0.1", 8080) is None


def test_connections_past_the_cap_are_closed_at_once_and_served_again_once_one_ends(monkeypatch):
    import processor.runtime.http_endpoint as http_endpoint

    monkeypatch.setattr(http_endpoint, "MAX_CONNECTIONS", 3)
    ep = serve()
    idle = [socket.create_connection(("127.0.0.1", ep.port), timeout=10) for _ in range(3)]
    try:
        time.sleep(0.2)   # (accepted, each holding a thread, sending nothing)
        with socket.create_connection(("127.0.0.1", ep.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(100) == b""   # closed without an answer: no thread for it
        idle.pop().close()
        deadline = time.monotonic() + 5
        while True:   # the closed one's thread ends, and a probe is served again
            try:
                status, _, body = request(ep.port, "GET", "/healthz")
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert status == 200 and body["status"] == "ok"
    finally:
        for s in idle:
            s.close()
        ep.stop()
