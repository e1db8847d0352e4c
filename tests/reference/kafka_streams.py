"""Kafka Streams itself, run as the reference: its jars fetched from Maven Central by the pom
beside this module, the Java twins (``java/``) compiled with ``javac`` against them, and a
request of cases run in one JVM, each in Kafka Streams' own ``TopologyTestDriver``.

- ``classpath()``: Kafka Streams ``VERSION``'s jars with ``kafka-streams-test-utils``, fetched
  once into the cache beside Apache Kafka's (``processor.runtime.apache_kafka.cache_dir()``).
- ``compiled()``: the twins' classes, compiled once per content of ``java/`` (a folder named by
  the sources' hash, under a lock, renamed into place).
- ``run_cases(cases)``: one JVM over every case; returns the answers by case id.
- ``Reference()``: one JVM kept running, answering request after request (``.run(cases)``), for
  many small requests (hypothesis' examples, shrinking).

Every failure is a ``ReferenceUnavailable`` naming which part and why: no Java or Maven, Maven
Central out of reach, a twin that does not compile (javac's first error), a JVM that died. The
suite fails on it; it never skips.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processor.errors import ConfigError
from processor.runtime.apache_kafka import built_once, cache_dir, check_java, maven_classpath

VERSION = "4.4.0"
HERE = Path(__file__).parent
POM = HERE / "kafka_streams_pom.xml"
SOURCES = HERE / "java"


class ReferenceUnavailable(RuntimeError):
    """Kafka Streams could not be run as the reference; the message says which part and why."""


def classpath() -> Path:
    try:
        check_java()
        return maven_classpath(POM, f"kafka-streams-{VERSION}", {"kafka.version": VERSION},
                               "kafka-streams-test-utils-*.jar", f"Kafka Streams {VERSION}",
                               otherwise="the differential suite needs Kafka Streams itself")
    except ConfigError as e:
        raise ReferenceUnavailable(str(e)) from e


def _sources_hash() -> str:
    h = hashlib.sha256(VERSION.encode())
    for src in sorted(SOURCES.glob("*.java")):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:16]


def compiled() -> Path:
    """The folder of the twins' compiled classes (compiled at most once per source content)."""
    libs = classpath()
    javac = shutil.which("javac")
    if javac is None:
        raise ReferenceUnavailable("the Java twins are compiled with javac: install a JDK 17 or later "
                                   "(Debian: apt-get install openjdk-17-jdk-headless)")
    classes = cache_dir() / f"kafka-streams-{VERSION}" / f"classes-{_sources_hash()}"

    def compile_into(staging: Path) -> None:
        done = subprocess.run([javac, "-nowarn", "-encoding", "UTF-8", "-d", str(staging), "-cp", f"{libs}/*",
                               *map(str, sorted(SOURCES.glob("*.java")))],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            errors = [ln for ln in done.stderr.splitlines() if ": error:" in ln]
            first = errors[0] if errors else done.stderr.strip()[:400]
            raise ReferenceUnavailable(f"the Java twins did not compile against Kafka Streams {VERSION} "
                                       f"({len(errors)} error(s); the first: {first})")

    return built_once(classes, compile_into, VERSION)


@dataclass
class Case:
    """One run of a twin: ``steps`` are ``(topic, key bytes, value bytes, ts)`` records or
    ``("advance", ms)`` wall-clock moves; ``read`` the output topics; ``stores`` the key-value
    stores to dump, ``(name, key serde name, value serde name)``."""

    id: str
    topology: str
    params: dict[str, Any]
    steps: list[tuple]
    read: list[str]
    stores: list[tuple[str, str, str]]

    def with_params(self, params: dict[str, Any]) -> Case:
        """This case with the Java twin run with ``params``."""
        return Case(self.id, self.topology, params, self.steps, self.read, self.stores)

    def to_json(self) -> dict[str, Any]:
        def b64(b: bytes | None) -> str | None:
            return None if b is None else base64.b64encode(b).decode()

        steps: list[dict[str, Any]] = []
        for s in self.steps:
            if s[0] == "advance":
                steps.append({"advance": s[1]})
            else:
                steps.append({"topic": s[0], "key": b64(s[1]), "value": b64(s[2]), "ts": s[3]})
        return {"id": self.id, "topology": self.topology, "params": self.params, "steps": steps,
                "read": self.read, "stores": [{"name": n, "key": k, "value": v} for n, k, v in self.stores]}


@dataclass
class Answer:
    """What Kafka Streams gave: per topic ``[(key bytes, value bytes, ts, step)]`` (``step``: the
    index of the step that caused it), per store ``[(key, value)]``."""

    outputs: dict[str, list[tuple[bytes | None, bytes | None, int, int]]]
    stores: dict[str, list[tuple[bytes, bytes]]]
    error: str | None


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def _request(cases: list[Case]) -> str:
    return json.dumps({"cases": [c.to_json() for c in cases]})


def _answers(raw: dict[str, Any]) -> dict[str, Answer]:
    out: dict[str, Answer] = {}
    for c in raw["cases"]:
        outputs = {t: [(_unb64(k), _unb64(v), int(ts), int(i)) for k, v, ts, i in rows]
                   for t, rows in c["outputs"].items()}
        stores = {n: [(base64.b64decode(k), base64.b64decode(v)) for k, v in rows] for n, rows in c["stores"].items()}
        out[c["id"]] = Answer(outputs, stores, c["error"])
    return out


def java_command(main: str, *args: str, jvm_options: tuple[str, ...] = ("-Xmx1g", "-XX:+UseSerialGC")) -> list[str]:
    """The command running the compiled class ``main`` (``ReferenceRunner``, ``StreamsApp``) with
    ``args``; ``jvm_options`` default to a small heap and the serial collector (the suite's JVMs,
    one per test process), the peer benchmark runs with the JVM's own defaults."""
    classes = compiled()
    return ["java", *jvm_options, "-cp", f"{classes}:{classpath()}/*", main, *args]


def run_cases(cases: list[Case], timeout_s: float = 900) -> dict[str, Answer]:
    """Runs every case in one JVM; a case whose twin threw has ``error`` set."""
    command = java_command("ReferenceRunner")
    with tempfile.TemporaryDirectory(prefix="reference-") as tmp:
        request, answer = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        request.write_text(_request(cases))
        done = subprocess.run([*command, str(request), str(answer)], capture_output=True, text=True,
                              timeout=timeout_s, cwd=tmp)
        if done.returncode != 0 or not answer.exists():
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise ReferenceUnavailable(f"the reference JVM exited {done.returncode} before answering:\n{tail}")
        return _answers(json.loads(answer.read_text()))


class Reference:
    """One JVM answering requests one after another (``ReferenceRunner --serve``); ``close()``
    ends it."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="reference-")
        self._stderr = open(Path(self._tmp.name) / "stderr", "w+b")   # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(java_command("ReferenceRunner", "--serve"), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, cwd=self._tmp.name)

    def run(self, cases: list[Case]) -> dict[str, Answer]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(_request(cases).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = b""
        if not line:
            self._proc.wait(timeout=30)
            self._stderr.seek(0)
            tail = "\n".join(self._stderr.read().decode(errors="replace").strip().splitlines()[-8:])
            raise ReferenceUnavailable(f"the reference JVM exited {self._proc.returncode} before answering:\n{tail}")
        return _answers(json.loads(line))

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()
        self._tmp.cleanup()
