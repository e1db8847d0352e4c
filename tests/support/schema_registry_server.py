"""A minimal in-test implementation of the Confluent Schema Registry's REST API, over HTTP on
127.0.0.1 (a free port), served by a thread of the test process.

It is NOT a Schema Registry: it is a test double of the server side only, written for tests
whose registry clients run in other processes (a backfill's Spark executors), where the client
library's in-memory ``mock://`` registry cannot reach (that one lives in one process's memory).
The client under test is the real one: ``confluent_kafka.schema_registry.SchemaRegistryClient``
(with its ``AvroSerializer`` / ``AvroDeserializer``) speaks HTTP to this server exactly as it
would to Confluent's. Why not a real server: none installs on this machine (Confluent's and
Apicurio's are Maven/Docker artifacts, which this machine cannot fetch; karapace is not on the
package index it reaches; no Debian or npm package provides one).

What it serves (Confluent's paths, JSON shapes, status and error codes):

- ``POST /subjects/{subject}/versions`` register (``{"id": N}``; the same schema again gives
  the same id and no new version; one id per distinct schema across subjects, as Confluent);
  ``POST /subjects/{subject}`` look up a schema under a subject (``subject``, ``version``,
  ``id``, ``schema``; ``40401`` subject not found, ``40403`` schema not found);
- ``GET /schemas/ids/{id}`` (``40403``), ``/schemas/ids/{id}/subjects``,
  ``/schemas/ids/{id}/versions``, ``/schemas/guids/{guid}``, ``/schemas/types``;
- ``GET /subjects``, ``/subjects/{subject}/versions``,
  ``/subjects/{subject}/versions/{version|latest|-1}`` (``40401``, ``40402`` version not
  found, ``42202`` invalid version);
- ``DELETE /subjects/{subject}`` (soft delete: the versions' ids stay readable by id);
- ``GET /config`` and ``/config/{subject}``: ``{"compatibilityLevel": "NONE"}``.

Outages, for the tests of what a registry that cannot be used does to its clients (issue 47):
``down()`` closes the port (connections refused) and ``up()`` opens it again, the same port and
the same schemas; ``fail_with(401)`` (or 403, 429, 503...) answers every request with that status
and Confluent's error body until ``fail_with(None)``; ``delay_s`` holds every answer that long
(a client's request timeout). A request answered so is recorded too.

Schemas are identified by their canonical JSON (key order and whitespace ignored), a
simplification of Confluent's Avro canonical form. Not implemented: compatibility checking
(every version is accepted, as under ``NONE``), references, modes, contexts, metadata and rule
sets, authentication; any other path is ``404`` with ``error_code`` 404, as Confluent's answer
to an unknown endpoint. Among those, ``GET /associations/resources/...``: the client's default
subject strategy (confluent-kafka 2.16: ASSOCIATED) asks it once per serializer or
deserializer and, on the 404 (no associations), falls back to the topic's subject
(``<topic>-value``), as against a registry that has no associations. Every request is recorded
(``requests``: ``(method, path)``) so a test can show who asked for what.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["SchemaRegistryServer"]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class _Error(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject):
    return _Error(404, 40401, f"Subject '{subject}' not found.")


def _canonical(schema_str: str, schema_type: str) -> str:
    if schema_type in ("AVRO", "JSON"):
        try:
            return json.dumps(json.loads(schema_str), sort_keys=True, separators=(",", ":"))
        except ValueError:
            raise _Error(422, 42201, "Invalid schema: not JSON") from None
    return schema_str


class SchemaRegistryServer:
    """``with SchemaRegistryServer() as reg: reg.url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._schemas: dict[int, dict] = {}        # id -> {"schema", "schemaType", "guid"}
        self._ids: dict[tuple, int] = {}            # (schemaType, canonical schema) -> id
        self._subjects: dict[str, list] = {}        # subject -> [{"version", "id", "deleted"}]
        self.requests: list[tuple[str, str]] = []
        self.failure: tuple[int, int, str] | None = None   # (status, error code, message) of every answer
        self.delay_s = 0.0
        self._port = 0
        self._httpd = None
        self._thread = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> SchemaRegistryServer:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):   # quiet
                pass

            def _serve(self, method):
                parts = urlsplit(self.path)
                body = None
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    raw = self.rfile.read(length)
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = ValueError
                registry.requests.append((method, parts.path))
                if registry.delay_s:
                    time.sleep(registry.delay_s)
                try:
                    if registry.failure is not None:
                        raise _Error(*registry.failure)
                    if body is ValueError:
                        raise _Error(400, 400, "Unrecognized request body: not JSON")
                    status, payload = registry._handle(method, [unquote(p) for p in parts.path.strip("/").split("/")],
                                                       parse_qs(parts.query), body)
                except _Error as e:
                    status, payload = e.status, {"error_code": e.code, "message": e.message}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):   # a client that gave up (its timeout)
                    self.close_connection = True

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

            def do_DELETE(self):
                self._serve("DELETE")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._port = self._httpd.server_address[1]
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="schema-registry-server", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    # -- outages ----------------------------------------------------------------------------------
    def down(self) -> None:
        """Close the port: every connection is refused until ``up()`` (the schemas are kept)."""
        self.stop()

    def up(self) -> None:
        """Listen again, on the same port, with the same schemas."""
        if self._httpd is None:
            self.start()

    def fail_with(self, status: int | None, code: int | None = None, message: str | None = None) -> None:
        """Answer every request with HTTP ``status`` and Confluent's error body (``error_code``
        ``code``, default the status; ``message``, default the status's reason), or, with None,
        serve again."""
        if status is None:
            self.failure = None
            return
        reasons = {401: "Unauthorized", 403: "Forbidden", 429: "Too Many Requests", 500: "Internal Server Error",
                   502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
        self.failure = (status, status if code is None else code,
                        message if message is not None else reasons.get(status, f"HTTP {status}"))

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(10)
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- the API ----------------------------------------------------------------------------------
    def _handle(self, method: str, path: list[str], query: dict, body):
        with self._lock:
            return self._route(method, path, query, body)

    def _route(self, method, path, query, body):
        n = len(path)
        if path[0] == "schemas" and n >= 2:
            if method == "GET" and n == 2 and path[1] == "types":
                return 200, ["JSON", "PROTOBUF", "AVRO"]
            if method == "GET" and path[1] == "ids" and n in (3, 4):
                sid = self._schema_id(path[2])
                if n == 3:
                    return 200, self._schema_body(sid)
                if path[3] == "subjects":
                    return 200, sorted({s for s, vs in self._subjects.items()
                                        for v in vs if v["id"] == sid and not v["deleted"]})
                if path[3] == "versions":
                    return 200, [{"subject": s, "version": v["version"]} for s, vs in sorted(self._subjects.items())
                                 for v in vs if v["id"] == sid and not v["deleted"]]
            if method == "GET" and path[1] == "guids" and n == 3:
                for sid, s in self._schemas.items():
                    if s["guid"] == path[2]:
                        return 200, self._schema_body(sid)
                raise _Error(404, 40403, "Schema not found")
        if path[0] == "subjects":
            if n == 1 and method == "GET":
                return 200, sorted(s for s, vs in self._subjects.items() if any(not v["deleted"] for v in vs))
            subject = path[1] if n >= 2 else None
            if n == 2 and method == "POST":
                return 200, self._lookup(subject, body, deleted=query.get("deleted", ["false"])[0] == "true")
            if n == 2 and method == "DELETE":
                live = self._live(subject)
                for v in live:
                    v["deleted"] = True
                return 200, [v["version"] for v in live]
            if n == 3 and path[2] == "versions":
                if method == "POST":
                    return 200, {"id": self._register(subject, body)}
                if method == "GET":
                    return 200, [v["version"] for v in self._live(subject)]
            if n == 4 and path[2] == "versions" and method == "GET":
                return 200, self._version(subject, path[3])
        if path[0] == "config" and n <= 2 and method == "GET":
            return 200, {"compatibilityLevel": "NONE"}
        raise _Error(404, 404, "HTTP 404 Not Found")

    def _schema_id(self, text: str) -> int:
        try:
            sid = int(text)
        except ValueError:
            raise _Error(404, 40403, "Schema not found") from None
        if sid not in self._schemas:
            raise _Error(404, 40403, "Schema not found")
        return sid

    def _schema_body(self, sid: int) -> dict:
        s = self._schemas[sid]
        out = {"schema": s["schema"]}
        if s["schemaType"] != "AVRO":
            out["schemaType"] = s["schemaType"]
        return out

    def _live(self, subject: str) -> list:
        live = [v for v in self._subjects.get(subject, []) if not v["deleted"]]
        if not live:
            raise _subject_not_found(subject)
        return live

    def _parse(self, body) -> tuple[str, str, str]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise _Error(422, 42201, "Invalid schema: the request has no 'schema' string")
        if body.get("references"):
            raise _Error(422, 42201, "Invalid schema: references are not supported by this test server")
        schema_type = body.get("schemaType") or "AVRO"
        if schema_type not in ("AVRO", "JSON", "PROTOBUF"):
            raise _Error(422, 42201, f"Invalid schema type {schema_type}")
        return body["schema"], schema_type, _canonical(body["schema"], schema_type)

    def _register(self, subject: str, body) -> int:
        schema, schema_type, canon = self._parse(body)
        sid = self._ids.get((schema_type, canon))
        if sid is None:
            sid = len(self._schemas) + 1
            self._ids[(schema_type, canon)] = sid
            self._schemas[sid] = {"schema": schema, "schemaType": schema_type,
                                  "guid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"schema-{sid}"))}
        versions = self._subjects.setdefault(subject, [])
        if not any(v["id"] == sid and not v["deleted"] for v in versions):
            versions.append({"version": max((v["version"] for v in versions), default=0) + 1, "id": sid,
                             "deleted": False})
        return sid

    def _registered(self, subject: str, v: dict) -> dict:
        return {"subject": subject, "version": v["version"], "id": v["id"], **self._schema_body(v["id"])}

    def _lookup(self, subject: str, body, deleted: bool) -> dict:
        _, schema_type, canon = self._parse(body)
        versions = [v for v in self._subjects.get(subject, []) if deleted or not v["deleted"]]
        if not versions:
            raise _subject_not_found(subject)
        sid = self._ids.get((schema_type, canon))
        for v in versions:
            if v["id"] == sid:
                return self._registered(subject, v)
        raise _Error(404, 40403, "Schema not found")

    def _version(self, subject: str, text: str) -> dict:
        live = self._live(subject)
        if text in ("latest", "-1"):
            return self._registered(subject, live[-1])
        try:
            number = int(text)
        except ValueError:
            number = 0
        if number < 1:
            raise _Error(422, 42202, f"The specified version '{text}' is not a valid version id. Allowed values are "
                                     "between [1, 2^31-1] and the string \"latest\"")
        for v in live:
            if v["version"] == number:
                return self._registered(subject, v)
        raise _Error(404, 40402, f"Version {number} not found.")
