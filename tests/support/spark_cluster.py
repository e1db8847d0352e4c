"""A Spark standalone cluster on this machine whose executors see none of the driver's files.

pyspark ships ``bin/spark-class``: a Master (``org.apache.spark.deploy.master.Master``) and one
Worker (``org.apache.spark.deploy.worker.Worker``) on 127.0.0.1. The Worker, and so every
executor and Python worker it launches, runs in a private mount namespace (``unshare -m
--propagation private``) with a fresh tmpfs mounted over each hidden directory (the test's
temporary directories, where state directories and build roots live, and the repository's
``tests`` package, where the application modules are): as on a cluster whose executors run on
other machines, nothing the driver writes there is visible to them, and nothing they write there
reaches the driver. The project and its dependencies stay visible (the virtualenv stands in for
the packed environment or image a real cluster's executors get).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def _outermost(paths) -> list[str]:
    """The paths none of whose ancestors is also in ``paths`` (a tmpfs over a directory hides its
    subdirectories already)."""
    real = sorted({os.path.realpath(p) for p in paths})
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


class StandaloneCluster:
    """``start()``, ``master_url``, ``stop()``; logs in ``log_dir``."""

    def __init__(self, hide, log_dir, cores: int = 2, memory: str = "3g"):
        self.hide = _outermost(hide)
        self.log_dir = Path(log_dir)
        self.cores = cores
        self.memory = memory
        self.master = self.worker = None
        self.port = _free_port()
        self.ui_port = _free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict:
        env = dict(os.environ)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.pop("PYTHONPATH", None)    # the executors import only what the venv or the job ships
        return env

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        if shutil.which("unshare") is None:
            raise RuntimeError("the standalone-cluster tests need unshare(1) (util-linux)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.master = subprocess.Popen(
            [spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env=self._env(), stdout=open(self.log_dir / "master.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self._wait(lambda: self._state() is not None, timeout_s, "the Spark master to answer")
        work_dir = "/tmp/spark-worker"   # inside the worker's own /tmp when /tmp is hidden
        mounts = " && ".join(f"mount -t tmpfs -o size=4g,mode=1777 tmpfs {shlex.quote(d)}" for d in self.hide)
        script = (f"set -e; {mounts}; mkdir -p {work_dir}; exec {shlex.quote(spark_class())} "
                  f"org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores {self.cores} "
                  f"--memory {self.memory} --work-dir {work_dir} --webui-port {_free_port()} {self.master_url}")
        self.worker = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=self._env(), stdout=open(self.log_dir / "worker.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self._wait(lambda: (self._state() or {}).get("aliveworkers", 0) >= 1, timeout_s,
                   "the Spark worker to register")
        return self

    def _state(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):   # (not up yet; or its web UI up before the status page: an empty body)
            return None

    def _wait(self, cond, timeout_s, what) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            for name, p in (("master", self.master), ("worker", self.worker)):
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited ({p.returncode}) while waiting for {what}; log:\n"
                                       + (self.log_dir / f"{name}.log").read_text()[-3000:])
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.2)

    def running_apps(self) -> int:
        return len((self._state() or {}).get("activeapps", []))

    def stop(self) -> None:
        for p in (self.worker, self.master):
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)
