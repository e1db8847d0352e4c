"""The worker's HTTP endpoint (``processor run --http-port P``; off by default), on the standard
library's ``ThreadingHTTPServer`` in a daemon thread: a thread per connection, a listen backlog of
``BACKLOG``, each connection closed after ``CONNECTION_TIMEOUT_S`` without a request, TLS
handshakes on the connection's thread (never on the accepting one). Who may read which route,
over TLS or not, and the address it binds: ``processor/runtime/http_security.py``.

Routes:
- ``GET /metrics``: Prometheus text format (``processor/runtime/worker_metrics.py``).
- ``GET /healthz``: 200 while the main loop has iterated within ``health_timeout_s``, else 503
  (a user function that hangs, a flush that never ends): a liveness probe.
- ``GET /readyz``: 200 once the worker has its assignment and every task of it is restored and
  running, the loop healthy; 503 before that and during a restore: a readiness probe.
- ``GET /stores/<store>/<key>``: ``{"key", "value", "timestamp", "partition", "task"}`` (404 with
  ``{"error", "partition", "task"}`` when another worker owns the key's partition; 404 without a
  partition for a key this worker owns but has no row for; 503 while its task restores).
  ``GET /stores/<store>?prefix=P&limit=N&after=C``: ``{"entries": [...], "next": C2}`` from every
  local task of the store: at most N entries (default ``DEFAULT_LIMIT``; a larger N than
  ``MAX_LIMIT`` is cut to it), in partition order; ``next`` (absent on the last page) is the
  ``after`` of the next page (``interactive_queries.Cursor``). Keys in the path are text: a
  string-keyed store takes them as they are, any other store parses them as JSON
  (``/stores/counts/42``). A Processor API window or session store
  answers a key with ``{"key", "windows": [...], "partition", "task"}`` (its live windows).
- ``GET /metadata/<store>/<key>``: ``{"active", "standbys", "partition", "task"}``, which
  servers hold the key (``StoreView.metadata``).

Queries across the fleet (``worker.fleet_map`` from the group's assignment, each member's
``--application-server``; the policy below is ``processor/runtime/fleet_queries.py``, apart from
HTTP: this file parses a request and writes the policy's answer):
- A key whose task this worker does not run is forwarded, once (with this worker's credentials:
  ``http_security.py`` invariant 3), to the server the fleet map
  names as its task's active (the request carries ``X-Processor-Forwarded: 1``; a forwarded
  request is never forwarded again: a worker asked for a key it does not run answers 503, the task
  moving between workers): the owner's status and body are
  relayed, with ``"served_by": "<server>"``. No active in the map, or an owner that does not
  answer within ``FORWARD_TIMEOUT_S``: 503 naming the task, or the server. ``?redirect=true``:
  307 to the owner instead. ``?stale=true``: a key of a task this worker keeps a standby
  replica of (caught up once) is answered here from that replica, ``"stale": true``; a key the
  replica has no row for is forwarded to the active (a replica behind is no proof of absence,
  so a replica asked by another worker answers 503, never 404). With ``?stale=true``, when the
  active cannot answer (down, restoring, the task between owners; or this worker is the active
  and restores it), the task's standbys are asked in turn: 503 only when no copy answers. A worker
  that knows no fleet (an empty fleet map: no member set ``--application-server``) forwards
  nothing and scans its own tasks only, as above.
- A prefix scan asks every server of the fleet map for the same page of its own tasks (forwarded
  requests; each answer names the cursor of each entry) and merges the answers in partition
  order, each partition's entries in the order its server returned them, up to the first
  partition where a server's page ended (past it that server's entries are on its next page),
  cut at ``limit``, ``next`` the cursor of the last entry; a partition is taken from the first server that returns it
  (this worker first), so no key comes twice. A server that does not answer 200 makes the
  whole answer 503 naming it, never a silently partial one, and so does a partition no server
  read (each answer names the partitions its server runs: a task restoring or between two
  owners is in none); ``?partial=true`` answers with what came, ``"missing": [servers]`` and
  ``"missing_partitions": [partitions]``. A global store's scan is answered here (every worker
  holds it whole).

Every answer is JSON (but ``/metrics``), errors too, whatever the status or the method (405 for
any but GET), with no server version; a request target is read as UTF-8 (raw or
percent-encoded; 400 when it is not UTF-8, 414 past ``MAX_TARGET`` characters); a request with a
body is 413. Log lines name a request target by its first ``LOGGED_TARGET_CHARS`` characters,
escaped; a client that goes away mid-answer is one DEBUG line, never a traceback.

Every answer carries ``X-Processor-Instance``: a random id of this endpoint, made when it starts.
``check_advertised`` uses it: once the endpoint listens, a worker given
``--application-server`` asks ``GET /healthz`` of that address itself and expects its own id
back. An address that does not resolve, refuses or times out, answers without the header, or
answers with another worker's id (an address copied from another worker's command) is named in
one warning line: the other workers' queries forwarded there will fail (or reach the wrong
worker); the worker runs on, processing is unaffected. ``--application-server`` without
``--http-port`` is named in one such line too. (Kafka Streams checks only that
``application.server`` is ``host:port``; the probe is ours. It asks from this worker: an address
only other machines can reach, behind a NAT without hairpinning, is reported unreachable.)

Invariant: the server threads never touch a task, a store or a Kafka client: metrics come from
the snapshot the main loop publishes, store reads are run by the main loop
(``processor/runtime/interactive_queries.py``), health reads one timestamp, and the fleet map
is read as one object (the worker replaces it whole).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processor.config import check_application_server
from processor.errors import ConfigError, ProcessorError
from processor.runtime.fleet_queries import FORWARDED, FleetQueries, key_of
from processor.runtime.http_security import LOOPBACK, NO_SECURITY, HTTPSecurity
from processor.runtime.interactive_queries import (
    KeyNotHosted,
    QueryBusy,
    QueryError,
    QueryHost,
    StoreView,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from processor.runtime.worker_metrics import WorkerMetrics

log = logging.getLogger("processor.http")

DEFAULT_HEALTH_TIMEOUT_S = 60.0
INSTANCE = "X-Processor-Instance"     # on every answer: the id of the endpoint that answered
PROBE_TIMEOUT_S = 5.0                 # how long the probe of the advertised address waits
ROUTES = "/metrics /healthz /readyz /stores/<store>/<key> /metadata/<store>/<key>"
BACKLOG = 128                 # connections the kernel queues before the server accepts them
CONNECTION_TIMEOUT_S = 30.0   # a connection's socket timeout: an idle or slow client's thread ends
HANDSHAKE_TIMEOUT_S = 10.0    # a TLS handshake's
MAX_CONNECTIONS = 256         # connections served at once (a thread each); more are closed at once
MAX_TARGET = 8192             # characters of a request target (414 past it)
LOGGED_TARGET_CHARS = 200     # characters of a request target a log line shows
OPEN_ROUTES = ("healthz", "readyz")


class EndpointHost(QueryHost, Protocol):
    """What the endpoint reads of a running worker (``processor/runtime/worker.py``), from its
    own threads: the queries' host, the metrics, and whether it is ready."""

    metrics_state: WorkerMetrics
    metrics_registry: CollectorRegistry

    def ready(self) -> bool: ...


class HTTPRefusal(Exception):
    """A request answered with an error status before it reaches a route (a bad target, no or
    wrong credentials)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


@dataclass(frozen=True)
class Target:
    """A request target, decoded: the route (``stores``, ``healthz``...; the path's first
    segment), the store and key text of ``/stores`` and ``/metadata`` (percent-decoded; a key
    may hold ``/``), the query's parameters."""

    path: str
    route: str
    store: str | None
    key: str | None
    query: dict[str, list[str]]


def parse_target(raw: str) -> Target:
    """``raw``, the request target as ``http.server`` gives it (its bytes read as Latin-1), read
    as UTF-8: raw bytes and percent-escapes alike; ``HTTPRefusal`` 400 when it is not UTF-8,
    414 when it is longer than ``MAX_TARGET``."""
    if len(raw) > MAX_TARGET:
        raise HTTPRefusal(414, f"the request target has {len(raw)} characters, more than {MAX_TARGET}")
    try:
        text = raw.encode("latin-1").decode("utf-8")
        url = urlsplit(text)
        query = parse_qs(url.query, errors="strict")
        path = url.path.rstrip("/") or "/"
        parts = path.split("/", 3)   # "", route, store, key
        route = parts[1] if len(parts) > 1 else ""
        store = key = None
        if route in ("stores", "metadata") and len(parts) > 2:
            store = unquote(parts[2], errors="strict")
            key = unquote(parts[3], errors="strict") if len(parts) > 3 and parts[3] else None
    except (UnicodeError, ValueError) as exc:
        raise HTTPRefusal(400, f"the request target is not UTF-8 text ({type(exc).__name__})") from None
    return Target(path, route, store, key, query)


def loggable(text: str, limit: int = LOGGED_TARGET_CHARS) -> str:
    """``text`` for a log line: its first ``limit`` characters, non-printable and non-ASCII ones
    escaped, and how long it was when it was cut."""
    shown = ascii(text[:limit])[1:-1]
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


def encode_json(obj) -> bytes:
    """An answer's body: orjson's (a 10,000-entry page holds the GIL ~7x less long than the
    standard library's encoder, which the probes' threads wait for), the standard library's for
    what orjson refuses (an integer past 64 bits); ``repr`` of what neither encodes."""
    try:
        return orjson.dumps(obj, default=repr, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return (json.dumps(obj, default=repr) + "\n").encode()


def probe_application_server(server: str, instance: str, timeout_s: float = PROBE_TIMEOUT_S,
                             security: HTTPSecurity = NO_SECURITY) -> str | None:
    """Why ``server`` (``host:port``) does not reach the endpoint whose id is ``instance``, or
    None when it does: ``GET /healthz`` there must answer with ``X-Processor-Instance: instance``
    (any status: the probe is about the address, not the worker's health); over TLS, with a
    certificate the other workers accept (``security.client_context``)."""
    host, port = check_application_server(server)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"host {host!r} does not resolve ({exc})"
    try:
        with urllib.request.urlopen(f"{security.scheme}://{server}/healthz", timeout=timeout_s,
                                    context=security.client_context) as r:
            status, got = r.status, r.headers.get(INSTANCE)
    except urllib.error.HTTPError as e:
        status, got = e.code, e.headers.get(INSTANCE)
    except (OSError, ValueError) as exc:   # refused, timed out, reset, not HTTP, a certificate refused
        reason = getattr(exc, "reason", exc)
        return f"no HTTP answer ({type(reason).__name__}: {reason})"
    if got is None:
        return f"it answered HTTP {status}, but not as a processor worker (no {INSTANCE} header)"
    if got != instance:
        return f"another worker's endpoint answered there (instance {got}, this one is {instance})"
    return None


def check_advertised(server: str | None, endpoint: WorkerHTTPEndpoint | None) -> threading.Thread | None:
    """The worker's ``--application-server`` checked against its endpoint (module docstring):
    one warning line when it has no endpoint, else a probe on a daemon thread (returned) that
    logs one line with its outcome."""
    if server is None:
        return None
    if endpoint is None:
        log.warning("application server %s: this worker serves no HTTP endpoint (no --http-port), so other workers' "
                    "queries forwarded to it fail; processing is unaffected", server)
        return None

    def probe() -> None:
        try:
            why = probe_application_server(server, endpoint.instance, security=endpoint.security)
        except Exception as exc:   # never the worker's concern beyond this line
            why = f"the probe failed ({type(exc).__name__}: {exc})"
        if why is None:
            log.info("application server %s reaches this worker's HTTP endpoint", server)
        else:
            log.warning("application server %s does not reach this worker's HTTP endpoint (port %d): %s; queries "
                        "the other workers forward there will not reach this worker; processing is unaffected",
                        server, endpoint.port, why)

    t = threading.Thread(target=probe, name="processor-http-probe", daemon=True)
    t.start()
    return t


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most ``MAX_CONNECTIONS`` at once: a connection past them is
    closed at once (its client retries), so idle or slow clients cannot pile up threads."""

    request_queue_size = BACKLOG
    daemon_threads = True
    tls_context: ssl.SSLContext | None = None
    connections = threading.BoundedSemaphore(1)   # (replaced per server in server_activate)

    def server_activate(self):
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().server_activate()

    def process_request(self, request, client_address):
        if not self.connections.acquire(blocking=False):
            log.debug("HTTP connection from %s refused: %d connections open", client_address[0], MAX_CONNECTIONS)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            if self.tls_context is not None:   # the handshake on this connection's thread
                try:
                    request.settimeout(HANDSHAKE_TIMEOUT_S)
                    request = self.tls_context.wrap_socket(request, server_side=True)
                except OSError as exc:   # (ssl.SSLError too) a client that is not TLS, a certificate refused
                    log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):   # a client gone mid-answer, a timeout: no traceback
            log.debug("HTTP connection from %s ended: %s: %s", client_address[0], type(exc).__name__, exc)
        else:
            log.warning("HTTP connection from %s failed", client_address[0], exc_info=True)


class WorkerHTTPEndpoint:
    def __init__(self, worker: EndpointHost, port: int, host: str = LOOPBACK,
                 health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S, security: HTTPSecurity | None = None):
        self.worker = worker
        self.instance = uuid.uuid4().hex   # X-Processor-Instance of every answer
        self.health_timeout_s = health_timeout_s
        self.security = security or NO_SECURITY
        # who answers for a key, and a scan across the fleet (processor/runtime/fleet_queries.py)
        self.queries = FleetQueries(worker, self.security)
        self.host = host
        handler = type("Handler", (_Handler,), {"endpoint": self})
        try:
            self.server = _Server((host, port), handler)
        except OSError as exc:
            raise ConfigError(f"--http-port {port}: cannot listen on {host}:{port}: {exc}") from None
        self.server.tls_context = self.security.server_context
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="processor-http", daemon=True)

    def start(self) -> WorkerHTTPEndpoint:
        self._thread.start()
        sec = self.security
        log.info("HTTP endpoint on %s://%s:%d: %s (/stores and /metadata: %s; /metrics: %s)", sec.scheme, self.host,
                 self.port, ROUTES, "token or client certificate" if sec.authenticates else "open",
                 "authenticated" if sec.metrics_auth else "open")
        warning = sec.exposure_warning(self.host, self.port)
        if warning:
            log.warning("%s", warning)
        loopback = ipaddress.ip_address(self.host).is_loopback if _is_ip(self.host) else self.host == "localhost"
        if loopback:
            log.info("the HTTP endpoint answers this machine only (%s): probes and scrapes from elsewhere (a "
                     "kubelet, Prometheus) need --http-host 0.0.0.0 or --application-server", self.host)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers -----------------------------------------------------------------------------
    def healthy(self) -> tuple[bool, float]:
        age = time.monotonic() - self.worker.metrics_state.loop_beat
        return age <= self.health_timeout_s, age


class _Handler(BaseHTTPRequestHandler):
    endpoint: WorkerHTTPEndpoint
    protocol_version = "HTTP/1.1"
    timeout = CONNECTION_TIMEOUT_S
    server_version = "processor"
    sys_version = ""

    def version_string(self) -> str:   # no library or Python version in the Server header
        return self.server_version

    # -- logs: through the project's logging, the target cut and escaped -----------------------
    def log_request(self, code="-", size="-"):
        log.debug("%s %s %s %s", self.client_address[0], self.command, loggable(getattr(self, "path", "")),
                  getattr(code, "value", code))

    def log_error(self, format, *args):   # (http.server: timeouts, bad request lines)
        log.debug("%s %s", self.client_address[0], loggable(format % args))

    def log_message(self, format, *args):
        log.debug("%s %s", self.client_address[0], loggable(format % args))

    # -- answers -------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header(INSTANCE, self.endpoint.instance)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError as exc:   # the client went away mid-answer
            self.close_connection = True
            log.debug("%s went away before its answer (%s %s): %s: %s", self.client_address[0], status,
                      loggable(self.path), type(exc).__name__, exc)

    def _json(self, status: int, obj, headers: dict[str, str] | None = None) -> None:
        self._send(status, encode_json(obj), headers=headers)

    def send_error(self, code, message=None, explain=None):
        """Every error http.server answers itself (a bad request line, an unknown method...) as
        JSON; an unknown method is 405."""
        command = getattr(self, "command", None)
        if code == HTTPStatus.NOT_IMPLEMENTED and command:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {command} not allowed: GET only"
        message = None if message is None else loggable(message)   # (http.server's quote the request line)
        self.log_error("code %d, message %s", int(code), message)
        self.close_connection = True
        if not hasattr(self, "path"):
            self.path = ""
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":   # a request line not understood
            self.request_version = self.protocol_version                 # (a status line and headers anyway)
        status = HTTPStatus(code)
        headers = {"Allow": "GET"} if status == HTTPStatus.METHOD_NOT_ALLOWED else None
        self._json(status.value, {"error": message or status.phrase}, headers)

    def _not_allowed(self):
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} not allowed: GET only")

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def _authorize(self) -> None:
        get_cert = getattr(self.connection, "getpeercert", None)
        refused = self.endpoint.security.refusal(self.headers.get("Authorization"),
                                                 bool(get_cert()) if get_cert is not None else False)
        if refused is not None:
            status, why = refused
            raise HTTPRefusal(status, why, {"WWW-Authenticate": 'Bearer realm="processor"'} if status == 401 else None)

    def do_GET(self):
        ep = self.endpoint
        try:
            if self.headers.get("Transfer-Encoding") or int(self.headers.get("Content-Length") or 0) > 0:
                self.close_connection = True   # (its body is never read)
                raise HTTPRefusal(413, "a GET request takes no body")
            target = parse_target(self.path)
            route = target.route
            if route in ("stores", "metadata") or (route == "metrics" and ep.security.metrics_auth):
                self._authorize()   # (the probes are always open: OPEN_ROUTES)
            if target.path == "/metrics":
                self._send(200, generate_latest(ep.worker.metrics_registry), CONTENT_TYPE_LATEST)
            elif target.path == "/healthz":
                ok, age = ep.healthy()
                self._json(200 if ok else 503, {"status": "ok" if ok else "main loop stuck",
                                                # up: a 503 never shows the timeout itself
                                                "main_loop_age_s": math.ceil(age * 1000) / 1000,
                                                "timeout_s": ep.health_timeout_s})
            elif target.path == "/readyz":
                ok, age = ep.healthy()
                ready = ok and ep.worker.ready()
                restoring = ep.worker.metrics_state.snapshot or {}
                self._json(200 if ready else 503, {
                    "status": "ready" if ready else ("main loop stuck" if not ok else "not ready"),
                    "restoring": sorted((restoring.get("restore") or {}).keys())})
            elif route == "stores" and target.store is not None:
                self._store(target)
            elif route == "metadata" and target.store is not None:
                view = StoreView(ep.worker, target.store)
                if target.key is None:
                    raise QueryError(f"/metadata/{target.store}: no key (GET /metadata/<store>/<key>)")
                self._json(200, dataclasses.asdict(view.metadata(key_of(view, target.key))))
            else:
                self._json(404, {"error": f"no route {loggable(target.path)}; routes: {ROUTES}"})
        except HTTPRefusal as exc:
            self._json(exc.status, {"error": str(exc)}, exc.headers)
        except KeyNotHosted as exc:
            self._json(404, {"error": str(exc), "partition": exc.partition, "task": exc.task})
        except QueryError as exc:
            self._json(exc.http_status, {"error": str(exc)}, {"Retry-After": "1"} if isinstance(exc, QueryBusy)
                       else None)
        except (ValueError, TypeError, LookupError, ProcessorError) as exc:
            # a bad key for its serde, a decoding failure: the caller's answer
            log.warning("HTTP %s: %s", loggable(self.path), loggable(str(exc)))
            self._json(400, {"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:
            log.warning("HTTP %s failed", loggable(self.path), exc_info=True)
            self._json(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _store(self, target: Target) -> None:
        """A key's row or a prefix scan: the fleet's query policy answers
        (``processor/runtime/fleet_queries.py``), this writes its answer."""
        assert target.store is not None
        view = StoreView(self.endpoint.worker, target.store)
        forwarded = bool(self.headers.get(FORWARDED))
        queries = self.endpoint.queries
        if target.key is None:
            answer = queries.prefix(view, target.query, forwarded)
        else:
            answer = queries.key(view, target.key, target.query, forwarded)
        self._json(answer.status, answer.body, headers=answer.headers)

