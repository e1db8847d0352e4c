"""``--application-server`` that does not reach the worker (``processor/runtime/http_endpoint.py``,
``check_advertised``), with real local sockets: the worker asks ``GET /healthz`` of its advertised
address and expects its own endpoint's ``X-Processor-Instance`` back. Every way it can fail is
named (no resolution, no HTTP answer, an answer that is not a worker's, another worker's answer)
in one warning line; an address that reaches it gets one info line; an advertised address
without an HTTP endpoint is one warning line at once."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from processor.runtime.http_endpoint import INSTANCE, WorkerHTTPEndpoint, check_advertised, probe_application_server
from processor.runtime.local_broker import free_port


def stub_worker():
    return SimpleNamespace(metrics_state=SimpleNamespace(loop_beat=time.monotonic()))


@pytest.fixture
def endpoint():
    ep = WorkerHTTPEndpoint(stub_worker(), 0, "127.0.0.1").start()
    try:
        yield ep
    finally:
        ep.stop()


def test_every_answer_names_the_endpoint(endpoint):
    for path in ("/healthz", "/no-such-route"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}{path}", timeout=5) as r:
                headers = r.headers
        except urllib.error.HTTPError as e:
            headers = e.headers
        assert headers[INSTANCE] == endpoint.instance


def test_the_worker_s_own_address_reaches_it(endpoint):
    assert probe_application_server(f"127.0.0.1:{endpoint.port}", endpoint.instance) is None
    assert probe_application_server(f"localhost:{endpoint.port}", endpoint.instance) is None


def test_a_host_that_does_not_resolve(endpoint):
    why = probe_application_server(f"no-such-host.invalid:{endpoint.port}", endpoint.instance)
    assert why is not None and why.startswith("host 'no-such-host.invalid' does not resolve ("), why


def test_a_port_nobody_listens_on(endpoint):
    why = probe_application_server(f"127.0.0.1:{free_port()}", endpoint.instance)
    assert why is not None and why.startswith("no HTTP answer (ConnectionRefusedError"), why


def test_a_listener_that_never_answers(endpoint):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        why = probe_application_server(f"127.0.0.1:{s.getsockname()[1]}", endpoint.instance, timeout_s=0.3)
    assert why is not None and why.startswith("no HTTP answer (") and "timed out" in why, why


def test_an_http_server_that_is_not_a_worker(endpoint):
    class Plain(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        why = probe_application_server(f"127.0.0.1:{server.server_address[1]}", endpoint.instance)
    finally:
        server.shutdown()
        server.server_close()
    assert why == f"it answered HTTP 200, but not as a processor worker (no {INSTANCE} header)"


def test_another_worker_s_address(endpoint):
    other = WorkerHTTPEndpoint(stub_worker(), 0, "127.0.0.1").start()
    try:
        why = probe_application_server(f"127.0.0.1:{other.port}", endpoint.instance)
    finally:
        other.stop()
    assert why == f"another worker's endpoint answered there (instance {other.instance}, this one is " \
                  f"{endpoint.instance})"


def test_one_line_each(endpoint, caplog):
    caplog.set_level(logging.INFO, logger="processor.http")
    bad = f"127.0.0.1:{free_port()}"
    check_advertised(bad, endpoint).join(10)
    check_advertised(f"127.0.0.1:{endpoint.port}", endpoint).join(10)
    assert check_advertised("127.0.0.1:9", None) is None
    assert check_advertised(None, endpoint) is None
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "application server" in r.getMessage()]
    assert len(lines) == 3, lines
    assert lines[0][0] == "WARNING" and lines[0][1].startswith(
        f"application server {bad} does not reach this worker's HTTP endpoint (port {endpoint.port}): no HTTP "
        f"answer (ConnectionRefusedError")
    assert lines[0][1].endswith("; queries the other workers forward there will not reach this worker; processing "
                                "is unaffected")
    assert lines[1] == ("INFO", f"application server 127.0.0.1:{endpoint.port} reaches this worker's HTTP endpoint")
    assert lines[2] == ("WARNING", "application server 127.0.0.1:9: this worker serves no HTTP endpoint (no "
                                   "--http-port), so other workers' queries forwarded to it fail; processing is "
                                   "unaffected")
