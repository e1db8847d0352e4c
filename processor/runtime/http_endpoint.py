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

Invariant: the server threads never touch a task, a store or a Kafka client: metrics come from
the snapshot the main loop publishes, store reads are run by the main loop
(``processor/runtime/interactive_queries.py``), health reads one timestamp.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from processor.errors import ConfigError
from processor.runtime.interactive_queries import DEFAULT_LIMIT, KeyNotHosted, QueryError, StoreView
from processor.serde import StringSerde

if TYPE_CHECKING:
    from processor.runtime.worker import Worker

log = logging.getLogger("processor.http")

DEFAULT_HEALTH_TIMEOUT_S = 60.0


class WorkerHTTPEndpoint:
    def __init__(self, worker: Worker, port: int, host: str = "0.0.0.0",
                 health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S):
        self.worker = worker
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
        log.info("HTTP endpoint on port %d: /metrics /healthz /readyz /stores/<store>/<key>", self.port)
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

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, (json.dumps(obj, default=repr) + "\n").encode())

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
            else:
                self._json(404, {"error": f"no route {path}; routes: /metrics /healthz /readyz /stores/<store>/<key>"})
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
        if key_text:
            key_text = unquote(key_text)
            key = key_text if isinstance(view.key_serde, StringSerde) else json.loads(key_text)
            entry = view.entry(key)
            if entry is None:
                self._json(404, {"error": f"no row for key {key_text!r} in store {view.name!r}",
                                 "partition": view.worker._queries.call(
                                     lambda: view.owner_partition(view.key_serde.serialize(key))),
                                 "hosted_here": True})   # (serialized by the main loop)
            else:
                self._json(200, entry)
            return
        limit = int(query.get("limit", [DEFAULT_LIMIT])[0])
        self._json(200, {"entries": view.prefix(query.get("prefix", [""])[0], limit=limit)})
