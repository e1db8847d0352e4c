"""Apache Kafka, the broker users run: assembled from Maven Central by the project's own pom and
started as KRaft nodes on loopback, for the test suite and ``processor broker --apache-kafka``.

- ``kafka_classpath(version)`` returns a folder holding the broker's runtime jars. They are
  fetched once per version by ``mvn dependency:copy-dependencies`` on the pom beside this module
  (``apache_kafka_pom.xml``) into a cache: ``$PROCESSOR_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/processor``, else ``~/.cache/processor``; Maven keeps its own download cache
  in ``~/.m2``. The fetch holds a file lock (parallel test workers fetch once) and writes into a
  temporary folder renamed into place, so a half-fetched classpath is never used.
- ``ApacheKafka(nodes=N)`` formats (``kafka.tools.StorageTool format``) and starts N combined
  broker+controller nodes on free loopback ports (one node: replication factor 1 for the
  internal topics; three: replication factor 3 and ``min.insync.replicas=2``), and is ready
  when every client port accepts a connection (a node opens it once it is ready). Settings for
  tests, as Kafka's own embedded clusters set them: ``group.initial.rebalance.delay.ms=0``,
  ``group.min.session.timeout.ms=0``, a timed-out transaction is aborted within a second of its
  timeout. ``kill``/``pause``/``resume``/``stop_node``/``start_node`` act on one node.

Every error a user can fix is a ``ConfigError`` of one line naming what to do: no Java or one too
old, no Maven, Maven unable to fetch, a version older than KRaft-only Kafka, a port taken, a node
that exited at start (with the last error line of its log).
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from processor.errors import ConfigError
from processor.runtime.local_broker import free_port

DEFAULT_VERSION = "4.4.0"
MIN_JAVA = 17
POM = Path(__file__).with_name("apache_kafka_pom.xml")
JVM_OPTIONS = ["-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]

_LOG4J2 = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: org.apache.kafka.storage.internals.log
        level: WARN
"""


def cache_dir() -> Path:
    if os.environ.get("PROCESSOR_CACHE_DIR"):
        return Path(os.environ["PROCESSOR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "processor"


def parse_version(version: str) -> tuple[int, ...]:
    """``"4.4.0"`` -> ``(4, 4, 0)``; a ConfigError for anything that is not dotted numbers."""
    if not re.fullmatch(r"\d+(\.\d+){1,2}", version):
        raise ConfigError(f"Apache Kafka version {version!r} is not a release number such as {DEFAULT_VERSION}")
    return tuple(int(p) for p in version.split("."))


def check_version(version: str) -> None:
    """KRaft-only brokers (no ZooKeeper, transactions and the classic and consumer group
    protocols) start at 4.0; older releases need ZooKeeper or run KRaft as a preview."""
    if parse_version(version) < (4, 0):
        raise ConfigError(
            f"Apache Kafka {version} cannot run as a KRaft node here (KRaft-only brokers start at 4.0; "
            f"before 3.3 KRaft was a preview, before 0.11 there were no transactions): "
            f"use 4.0 or later (default {DEFAULT_VERSION})")


def java_major() -> int:
    java = shutil.which("java")
    if java is None:
        raise ConfigError(f"Apache Kafka needs Java {MIN_JAVA} or later on PATH "
                          "(Debian: apt-get install openjdk-17-jre-headless), or KAFKA_BOOTSTRAP_SERVERS")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise ConfigError(f"cannot read the version of {java} ('java -version' said: "
                          f"{(out.stderr or out.stdout).strip()[:200]!r})")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> None:
    major = java_major()
    if major < MIN_JAVA:
        raise ConfigError(f"Apache Kafka 4 needs Java {MIN_JAVA} or later; 'java' on PATH is Java {major}: "
                          "install a newer one (Debian: apt-get install openjdk-17-jre-headless)")


def kafka_classpath(version: str = DEFAULT_VERSION) -> Path:
    """The folder of Apache Kafka ``version``'s runtime jars, fetched from Maven Central once."""
    check_version(version)
    return maven_classpath(POM, f"apache-kafka-{version}", {"kafka.version": version}, "kafka_2.13-*.jar",
                           f"Apache Kafka {version}")


def maven_classpath(pom: Path, name: str, properties: dict[str, str], expect: str, what: str,
                    otherwise: str = "or set KAFKA_BOOTSTRAP_SERVERS to a running broker") -> Path:
    """The folder ``cache_dir()/name/libs`` of the jars ``pom`` depends on, fetched from Maven
    Central once by ``mvn dependency:copy-dependencies`` (``-Dkey=value`` for each of
    ``properties``); complete only if a jar matches the glob ``expect``. Under a file lock, into
    a temporary folder renamed into place. ``what`` names it in errors, ``otherwise`` ends their
    advice."""
    home = cache_dir() / name
    libs = home / "libs"
    if (libs / ".complete").exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(f"{what} is assembled from Maven Central with Maven: install it "
                          "(Debian: apt-get install maven), " + otherwise)

    def fetch(staging: Path) -> None:
        cmd = [mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
               *(f"-D{k}={v}" for k, v in properties.items()), f"-DoutputDirectory={staging}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not any(staging.glob(expect)):
            said = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln]
            first = said[0].replace("[ERROR]", "").strip()[:300] if said else f"exit code {done.returncode}"
            raise ConfigError(f"Maven could not fetch {what} from Maven Central ({first}): "
                              "check that Maven Central is reachable (proxy settings in ~/.m2/settings.xml), "
                              + otherwise)

    return built_once(libs, fetch, what)


def built_once(target: Path, build: Callable[[Path], None], label: str) -> Path:
    """``target``, made once by ``build(staging)``: under a file lock beside it, into a temporary
    folder renamed into place (marked complete with ``label``), so parallel callers build once
    and a half-built folder is never used. ``build`` raises to give up; nothing is left then."""
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
        try:
            build(staging)
            (staging / ".complete").write_text(f"{label}\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _terminate_with_parent() -> None:
    """In the child before exec: Linux's PR_SET_PDEATHSIG, SIGTERM when the parent dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG
    except OSError:
        pass


def random_cluster_id() -> str:
    """A cluster id as ``StorageTool random-uuid`` makes one (16 random bytes, URL-safe base64
    without padding, never starting with '-'), without starting a JVM for it."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _port_free(port: int) -> bool:
    """Whether a listener can bind ``port`` as the broker's does (SO_REUSEADDR: a restarted node's
    old connections in TIME_WAIT do not hold it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class KafkaNode:
    """One combined broker+controller process of an ``ApacheKafka`` cluster."""

    node_id: int
    port: int
    controller_port: int
    directory: Path
    proc: subprocess.Popen | None = None
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def properties(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def last_error(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
        return (errors[0] if errors else (lines[-1] if lines else "")).strip()[:400]


class ApacheKafka:
    """Apache Kafka ``version`` as ``nodes`` KRaft nodes on 127.0.0.1; use as a context manager.

    ``port`` fixes the first node's client port (a free one otherwise); ``directory`` keeps the
    nodes' data and logs there (a temporary folder, removed at ``stop``, otherwise);
    ``settings`` add to or override the broker settings of every node."""

    def __init__(self, nodes: int = 1, version: str = DEFAULT_VERSION, port: int | None = None,
                 directory: str | os.PathLike | None = None, settings: dict[str, str] | None = None):
        if nodes < 1:
            raise ConfigError(f"an Apache Kafka cluster needs at least one node, not {nodes}")
        check_version(version)
        self.version = version
        self.node_count = nodes
        self._port = port
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self._settings = dict(settings or {})
        self.nodes: list[KafkaNode] = []
        self._java: list[str] = []

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def describe(self) -> str:
        return f"Apache Kafka {self.version} (KRaft, {self.node_count} node{'s' if self.node_count > 1 else ''})"

    def broker_settings(self, node: KafkaNode) -> dict[str, str]:
        replicas = min(3, self.node_count)
        isr = 2 if replicas >= 3 else 1
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(node.directory / "data"),
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(isr),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(isr),
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(isr),
            # the settings of Kafka's own embedded test clusters
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "0",
            # a timed-out transaction is aborted within a second of its timeout (default 10 s)
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        }
        if self.node_count == 1:
            # a lone node is never partitioned from its own controller, but a heavily loaded machine
            # (load 120-200 seen here) delayed its heartbeats past the default 9 s: the broker was
            # fenced ("All brokers are currently fenced") and its groups expired at once
            settings["broker.session.timeout.ms"] = "30000"
        settings.update(self._settings)
        return settings

    def start(self, timeout_s: float = 120.0) -> ApacheKafka:
        check_java()
        libs = kafka_classpath(self.version)
        self._java = [shutil.which("java") or "java", *JVM_OPTIONS, "-cp", f"{libs}/*"]
        if self._port is not None and not _port_free(self._port):
            raise ConfigError(f"port {self._port} on 127.0.0.1 is taken: stop what listens there or choose another "
                              "--port (or none, for a free one)")
        self.nodes = []
        for i in range(self.node_count):
            port = self._port if (i == 0 and self._port is not None) else free_port()
            node = KafkaNode(node_id=i + 1, port=port, controller_port=free_port(),
                             directory=self.directory / f"node-{i + 1}")
            node.directory.mkdir(parents=True, exist_ok=True)
            self.nodes.append(node)
        log4j = self.directory / "log4j2.yaml"
        log4j.write_text(_LOG4J2)
        self._java.insert(1, f"-Dlog4j2.configurationFile={log4j}")
        cluster_id = random_cluster_id()
        for node in self.nodes:
            node.properties.write_text("".join(f"{k}={v}\n" for k, v in self.broker_settings(node).items()))
        formats = [subprocess.Popen([*self._java, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                     "-c", str(n.properties)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for n in self.nodes]
        for node, proc in zip(self.nodes, formats, strict=True):
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise ConfigError(f"Apache Kafka {self.version}: formatting node {node.node_id}'s storage failed: "
                                  f"{out.strip().splitlines()[-1] if out.strip() else proc.returncode}")
        try:
            for node in self.nodes:
                self._launch(node)
        except BaseException:
            self.stop()   # (the nodes launched before the one that could not be)
            raise
        self._wait_ready(self.nodes, timeout_s)
        return self

    def _launch(self, node: KafkaNode) -> None:
        for port in (node.port, node.controller_port):
            if not _port_free(port):
                raise ConfigError(f"port {port} on 127.0.0.1 is taken: Apache Kafka node {node.node_id} cannot "
                                  "listen there; stop what listens there")
        node.log = open(node.log_path, "ab")
        # a session of its own (a terminal's Ctrl-C reaches the node only through ``stop``), and
        # SIGTERM when the process that started it dies (no node outlives a killed test run)
        node.proc = subprocess.Popen([*self._java, "kafka.Kafka", str(node.properties)],
                                     stdout=node.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_terminate_with_parent)

    def _wait_ready(self, nodes: list[KafkaNode], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = list(nodes)
        while waiting and time.monotonic() < deadline:
            for node in list(waiting):
                if node.proc is not None and node.proc.poll() is not None:
                    code = node.proc.returncode
                    self.stop()
                    raise ConfigError(f"Apache Kafka {self.version} node {node.node_id} exited with code {code} at "
                                      f"start: {node.last_error()} (log: {node.log_path})")
                if _answers(node.port):
                    waiting.remove(node)
            if waiting:
                time.sleep(0.05)
        if waiting:
            names = ", ".join(f"node {n.node_id} (127.0.0.1:{n.port}, log {n.log_path})" for n in waiting)
            self.stop()
            raise ConfigError(f"Apache Kafka {self.version} did not open its client port within {timeout_s:.0f} s: "
                              f"{names}")

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in this cluster (nodes {[n.node_id for n in self.nodes]})")

    def pid(self, node_id: int = 1) -> int:
        proc = self.node(node_id).proc
        if proc is None:
            raise RuntimeError(f"node {node_id} is not running")
        return proc.pid

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (its data stays; ``start_node`` brings it back)."""
        node = self.node(node_id)
        if node.running():
            assert node.proc is not None
            node.proc.kill()
            node.proc.wait()
        self._close_log(node)

    def pause(self, node_id: int = 1) -> None:
        os.kill(self.pid(node_id), signal.SIGSTOP)

    def resume(self, node_id: int = 1) -> None:
        os.kill(self.pid(node_id), signal.SIGCONT)

    def stop_node(self, node_id: int, timeout_s: float = 60.0) -> None:
        """A controlled shutdown of one node (SIGTERM: it hands its leaderships over first)."""
        node = self.node(node_id)
        if node.running():
            assert node.proc is not None
            node.proc.send_signal(signal.SIGCONT)
            node.proc.terminate()
            try:
                node.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
        self._close_log(node)

    def start_node(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Start a stopped or killed node again on its own data and ports."""
        node = self.node(node_id)
        if node.running():
            return
        self._launch(node)
        self._wait_ready([node], timeout_s)

    @staticmethod
    def _close_log(node: KafkaNode) -> None:
        if node.log is not None:
            node.log.close()
            node.log = None

    def stop(self) -> None:
        for node in self.nodes:
            if node.running():
                assert node.proc is not None
                node.proc.send_signal(signal.SIGCONT)
                node.proc.terminate()
        for node in self.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()
                node.proc = None
            self._close_log(node)
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
