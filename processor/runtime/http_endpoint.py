"""The worker's HTTP endpoint (``processor run --http-port P``; off by default), on the standard
library's ``ThreadingHTTPServer`` in a daemon thread.

Routes:
- ``GET /metrics``: Prometheus text format (``processor/runtime/worker_metrics.py``).
- ``GET /healthz``: 200 while the main loop has iterated within ``health_timeout_s``, else 503
  (a user function that hangs, a flush that never ends): a liveness probe.
- ``GET /readyz``: 200 once the worker has its assignment and every task of it is restored and
  running, the loop healthy; 503 before that and during a restore: a readiness probe.
- ``GET /stores/<store>/<key>``: ``{"key", "value", "timestamp", "partition", "task"}`` (404 with
  ``{"error", "partition", "task"}`` when another worker owns the key's partition; 404 without a
  partition for a key this worker owns but has no row for; 503 while its task restores).
  ``GET /stores/<store>?prefix=P&limit=N``: ``{"entries": [...]}`` from every local task of the
  store. Keys in the path are text: a string-keyed store takes them as they are, any other
  store parses them as JSON (``/stores/counts/42``). A Processor API window or session store
  answers a key with ``{"key", "windows": [...], "partition", "task"}`` (its live windows).
- ``GET /metadata/<store>/<key>``: ``{"active", "standbys", "partition", "task"}``, which
  servers hold the key (``StoreView.metadata``).

Queries across the fleet (``worker.fleet_map`` from the group's assignment, each member's
``--application-server``):
- A key whose task this worker does not run is forwarded, once, to the server the fleet map
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
- A prefix scan asks every server of the fleet map for its own tasks (forwarded requests) and
  merges the answers in partition order, each partition's entries in the order its server
  returned them, cut at ``limit``; a partition is taken from the first server that returns it
  (this worker first), so no key comes twice. A server that does not answer 200 makes the
  whole answer 503 naming it, never a silently partial one, and so does a partition no server
  read (each answer names the partitions its server runs: a task restoring or between two
  owners is in none); ``?partial=true`` answers with what came, ``"missing": [servers]`` and
  ``"missing_partitions": [partitions]``. A global store's scan is answered here (every worker
  holds it whole).

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
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processor.config import check_application_server
from processor.errors import ConfigError
from processor.runtime.interactive_queries import DEFAULT_LIMIT, KeyNotHosted, QueryError, StoreNotReady, StoreView
from processor.serde import StringSerde

if TYPE_CHECKING:
    from processor.runtime.worker import Worker

log = logging.getLogger("processor.http")

DEFAULT_HEALTH_TIMEOUT_S = 60.0
FORWARDED = "X-Processor-Forwarded"   # a request one worker sends another: answered here only
FORWARD_TIMEOUT_S = 5.0               # how long a worker waits for another's answer
INSTANCE = "X-Processor-Instance"     # on every answer: the id of the endpoint that answered
PROBE_TIMEOUT_S = 5.0                 # how long the probe of the advertised address waits
ROUTES = "/metrics /healthz /readyz /stores/<store>/<key> /metadata/<store>/<key>"


class PeerUnanswered(Exception):
    """Another worker of the fleet did not answer a forwarded request."""

    def __init__(self, server: str, reason: str):
        super().__init__(f"{server} did not answer: {reason}")
        self.server = server
        self.reason = reason


def ask_peer(server: str, path: str) -> tuple[int, dict]:
    """``(status, JSON body)`` of ``GET path`` on worker ``server`` (``host:port``), asked as a
    forwarded request; ``PeerUnanswered`` when it cannot be reached, times out or answers
    something that is not a JSON object."""
    req = urllib.request.Request(f"http://{server}{path}", headers={FORWARDED: "1"})
    try:
        try:
            with urllib.request.urlopen(req, timeout=FORWARD_TIMEOUT_S) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        body = json.loads(raw)
    except (OSError, ValueError) as exc:   # refused, timed out, reset; a body that is not JSON
        raise PeerUnanswered(server, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise PeerUnanswered(server, f"a {type(body).__name__} instead of a JSON object")
    return status, body


def probe_application_server(server: str, instance: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``server`` (``host:port``) does not reach the endpoint whose id is ``instance``, or
    None when it does: ``GET /healthz`` there must answer with ``X-Processor-Instance: instance``
    (any status: the probe is about the address, not the worker's health)."""
    host, port = check_application_server(server)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"host {host!r} does not resolve ({exc})"
    try:
        with urllib.request.urlopen(f"http://{server}/healthz", timeout=timeout_s) as r:
            status, got = r.status, r.headers.get(INSTANCE)
    except urllib.error.HTTPError as e:
        status, got = e.code, e.headers.get(INSTANCE)
    except (OSError, ValueError) as exc:   # refused, timed out, reset, not HTTP
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
            why = probe_application_server(server, endpoint.instance)
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


class WorkerHTTPEndpoint:
    def __init__(self, worker: Worker, port: int, host: str = "0.0.0.0",
                 health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S):
        self.worker = worker
        self.instance = uuid.uuid4().hex   # X-Processor-Instance of every answer
        self.health_timeout_s = health_timeout_s
        handler = type("Handler", (_Handler,), {"endpoint": self})
        try:
            self.server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ConfigError(f"--http-port {port}: cannot listen on {host}:{port}: {exc}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="processor-http", daemon=True)

    def start(self) -> WorkerHTTPEndpoint:
        self._thread.start()
        log.info("HTTP endpoint on port %d: %s", self.port, ROUTES)
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

    def log_message(self, fmt, *args):   # access log at debug level, not on stderr
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header(INSTANCE, self.endpoint.instance)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict[str, str] | None = None) -> None:
        self._send(status, (json.dumps(obj, default=repr) + "\n").encode(), headers=headers)

    def do_GET(self):
        ep = self.endpoint
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        try:
            if path == "/metrics":
                self._send(200, generate_latest(ep.worker.metrics_registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, age = ep.healthy()
                self._json(200 if ok else 503, {"status": "ok" if ok else "main loop stuck",
                                                # up: a 503 never shows the timeout itself
                                                "main_loop_age_s": math.ceil(age * 1000) / 1000,
                                                "timeout_s": ep.health_timeout_s})
            elif path == "/readyz":
                ok, age = ep.healthy()
                ready = ok and ep.worker.ready()
                restoring = ep.worker.metrics_state.snapshot or {}
                self._json(200 if ready else 503, {
                    "status": "ready" if ready else ("main loop stuck" if not ok else "not ready"),
                    "restoring": sorted((restoring.get("restore") or {}).keys())})
            elif path.startswith("/stores/"):
                self._store(path[len("/stores/"):], parse_qs(url.query))
            elif path.startswith("/metadata/"):
                name, _, key_text = path[len("/metadata/"):].partition("/")
                view = StoreView(ep.worker, unquote(name))
                if not key_text:
                    raise QueryError(f"/metadata/{name}: no key (GET /metadata/<store>/<key>)")
                self._json(200, dataclasses.asdict(view.metadata(_key(view, key_text))))
            else:
                self._json(404, {"error": f"no route {path}; routes: {ROUTES}"})
        except KeyNotHosted as exc:
            self._json(404, {"error": str(exc), "partition": exc.partition, "task": exc.task})
        except QueryError as exc:
            self._json(exc.http_status, {"error": str(exc)})
        except Exception as exc:   # a bad key for its serde, a decoding failure: the caller's answer
            log.warning("HTTP %s: %s", self.path, exc)
            self._json(400, {"error": f"{type(exc).__name__}: {exc}"})

    def _store(self, rest: str, query: dict) -> None:
        name, _, key_text = rest.partition("/")
        view = StoreView(self.endpoint.worker, unquote(name))
        if not key_text:
            self._prefix(view, query)
            return
        key = _key(view, key_text)
        worker = self.endpoint.worker
        stale, redirect, forwarded = _flag(query, "stale"), _flag(query, "redirect"), bool(self.headers.get(FORWARDED))
        try:
            entry, where = view.lookup(key, stale=stale)
        except KeyNotHosted as exc:
            if worker.application_server is None and not worker.fleet_map:
                raise   # not in a fleet that answers for any key: answered here only (404)
            if not worker.fleet_map:
                raise StoreNotReady(f"{exc} (this worker has no assignment from its group yet: ask again)") from None
            if forwarded:
                # the asking worker's map named this one, which does not run the task (any more, or
                # not yet): the task is moving, so ask again (never forwarded twice)
                raise StoreNotReady(f"{exc} (the task is moving between workers: ask again)") from None
            self._forward(view, key, redirect, stale)
            return
        except StoreNotReady:
            # restoring here, or a standby here that never caught up: another copy may answer
            # (a global store's tables are bootstrapping: every worker's are, or were, so here)
            if forwarded or not worker.fleet_map or view.is_global:
                raise
            self._forward(view, key, redirect, stale)
            return
        if entry is None and where.get("stale"):
            # a standby without the row is no proof the key has none: the active answers
            if forwarded:
                raise StoreNotReady(f"store {view.name!r}: the standby replica of task {where['task']} here has "
                                    f"no row for the key, which is no proof that the task has none")
            self._forward(view, key, redirect, stale=True)
            return
        if entry is None:
            self._json(404, {"error": f"no row for key {unquote(key_text)!r} in store {view.name!r}",
                             **where, "hosted_here": True})
        else:
            self._json(200, entry)

    def _forward(self, view: StoreView, key, redirect: bool, stale: bool) -> None:
        """Answer for a key whose task this worker cannot answer for: relay its active owner's
        answer (or send the caller there); with ``stale``, when the active cannot answer (down,
        restoring, the task between owners), a standby's. 503 only when no copy answers."""
        meta = view.metadata(key)
        me = self.endpoint.worker.application_server
        url = urlsplit(self.path)
        params = [(k, v) for k, v in parse_qs(url.query).items() if k not in ("stale", "redirect")]
        failures = []
        if meta.active is None:
            failures.append(f"store {view.name!r}: task {meta.task} (partition {meta.partition}) has no active "
                            f"worker in the fleet's assignment")
        elif meta.active == me:
            failures.append(f"store {view.name!r}: task {meta.task} is assigned to this worker ({me}) but not "
                            f"open here yet")
        elif redirect:
            query = urlencode([(k, v) for k, v in parse_qs(url.query).items() if k != "redirect"], doseq=True)
            location = f"http://{meta.active}{url.path}" + (f"?{query}" if query else "")
            self._json(307, {"location": location, "task": meta.task}, headers={"Location": location})
            return
        else:
            try:
                # (without ?stale: the active answers from its task, never from a standby it may keep)
                query = urlencode(params, doseq=True)
                status, body = ask_peer(meta.active, url.path + (f"?{query}" if query else ""))
                if status != 503 or not stale:
                    self._json(status, {**body, "served_by": meta.active})
                    return
                failures.append(f"{meta.active} answered 503: {body.get('error', body)}")
            except PeerUnanswered as exc:
                failures.append(f"store {view.name!r}: task {meta.task} is active on {exc.server}, which did not "
                                f"answer: {exc.reason}")
        if stale:
            query = urlencode(params + [("stale", ["true"])], doseq=True)
            for server in meta.standbys:
                if server == me:
                    continue   # (this worker's own copy was asked first)
                try:
                    status, body = ask_peer(server, url.path + f"?{query}")
                except PeerUnanswered as exc:
                    failures.append(str(exc))
                    continue
                if status == 200:   # (stale from its replica; fresh if the task runs there by now)
                    self._json(status, {**body, "served_by": server})
                    return
                failures.append(f"standby {server} answered {status}: {body.get('error', body)}")
        raise StoreNotReady("; ".join(failures))

    def _prefix(self, view: StoreView, query: dict) -> None:
        """This worker's entries, and (unless asked by another worker) every other server's."""
        worker = self.endpoint.worker
        limit = int(query.get("limit", [DEFAULT_LIMIT])[0])
        prefix = query.get("prefix", [""])[0]
        entries, partitions = view.scan(prefix, limit=limit)   # first: a refused scan is refused here
        fleet_map = worker.fleet_map
        if view.is_global or self.headers.get(FORWARDED) or not fleet_map:
            self._json(200, {"entries": entries, "partitions": partitions})
            return
        me = worker.application_server
        others = sorted(s for s in fleet_map if s != me)
        path = f"/stores/{quote(view.name, safe='')}?" + urlencode({"prefix": prefix, "limit": limit})
        answers: list[tuple[str | None, list[dict], list[int]]] = [(me, entries, partitions)]
        server: str | None
        missing: dict[str, str] = {}
        with ThreadPoolExecutor(max(1, len(others))) as pool:
            for server, got in zip(others, pool.map(lambda s: _scan_of(s, path), others), strict=True):
                if isinstance(got, str):
                    missing[server] = got
                else:
                    answers.append((server, *got))
        # a partition whose task no server runs now (restoring, or between two owners) has no
        # entries in any answer: the scan is incomplete, never silently short
        taken_from: dict[int, str | None] = {}   # partition -> the server whose entries are taken
        for server, _, parts in answers:   # (server None: this worker, no application server)
            for p in parts:
                taken_from.setdefault(p, server)
        unanswered = [p for p in range(view.partition_count()) if p not in taken_from]
        if (missing or unanswered) and not _flag(query, "partial"):
            why = list(missing.values())
            if unanswered:
                why.append(f"no worker runs the task of partition(s) {unanswered} now (restoring or moving)")
            raise StoreNotReady(f"store {view.name!r}: the prefix scan is incomplete: "
                                + "; ".join(why) + " (?partial=true answers without them)")
        merged = [e for server, got, _ in answers for e in got if taken_from.get(e["partition"]) == server]
        merged.sort(key=lambda e: e["partition"])   # stable: each partition in its server's order
        body: dict = {"entries": merged[:limit]}
        if _flag(query, "partial"):
            body["missing"] = sorted(missing)
            body["missing_partitions"] = unanswered
        self._json(200, body)


def _scan_of(server: str, path: str) -> tuple[list[dict], list[int]] | str:
    """A server's own entries of a prefix scan and the partitions it read them from, or why there
    are none."""
    try:
        status, body = ask_peer(server, path)
    except PeerUnanswered as exc:
        return str(exc)
    if status != 200 or not isinstance(body.get("entries"), list) or not isinstance(body.get("partitions"), list):
        return f"{server} answered {status}: {body.get('error', body)}"
    return body["entries"], body["partitions"]


def _key(view: StoreView, key_text: str):
    """A key from its text in a path: as it is for a string-keyed store, else JSON."""
    key_text = unquote(key_text)
    return key_text if isinstance(view.key_serde, StringSerde) else json.loads(key_text)


def _flag(query: dict, name: str) -> bool:
    return query.get(name, [""])[-1].lower() in ("true", "1", "yes")
