"""Producing known records to the real broker and reading DataFrame rows back as plain tuples."""

from __future__ import annotations

from confluent_kafka import Producer
from pyspark.sql import functions as F

from processor.kafka.clients import create_topics, producer_defaults


def records(n_per_partition: int, partitions: int, ts0: int = 1_700_000_000_000, tag: str = "r"):
    """(partition, key, value, timestamp ms, headers) for every partition, with null keys, null
    values (tombstones), bytes >= 0x80, no headers, several headers (a repeated key, a null
    header value)."""
    out = []
    for p in range(partitions):
        for i in range(n_per_partition):
            key = None if i % 5 == 3 else f"{tag}-k{p}-{i % 4}".encode()
            value = None if i % 7 == 6 else f"{tag}-v{p}-{i}".encode() + bytes([0x80 + i % 100])
            headers = [None, [("h", b"1")], [("a", b"x"), ("a", b"y"), ("n", None)]][i % 3]
            out.append((p, key, value, ts0 + 1000 * p + 3 * i, headers))
    return out


def produce(bootstrap: str, topic: str, recs, chunks: int = 3, producer: Producer | None = None) -> list[tuple]:
    """Produce ``recs`` in ``chunks`` flushed batches (so a partition holds several record
    batches) through ``producer`` (default: a new idempotent one; a transactional one must be in a
    transaction). Returns the expected rows in ``row_tuples``' form, offsets from the delivery
    reports, ordered by partition and offset."""
    p = producer or Producer(producer_defaults(bootstrap))
    offsets: dict[int, int] = {}

    def delivered(i):
        def on_delivery(err, msg):
            assert err is None, err
            offsets[i] = msg.offset()
        return on_delivery

    size = max(1, -(-len(recs) // chunks))
    for i, (part, key, value, ts, headers) in enumerate(recs):
        p.produce(topic, key=key, value=value, partition=part, timestamp=ts, headers=headers,
                  on_delivery=delivered(i))
        if (i + 1) % size == 0:
            p.flush()
    p.flush()
    assert len(offsets) == len(recs)
    return sorted((topic, part, offsets[i], key, value, ts * 1000, 0, headers)
                  for i, (part, key, value, ts, headers) in enumerate(recs))


def new_topic(bootstrap: str, name: str, partitions: int) -> str:
    create_topics(bootstrap, {name: partitions}, exist_ok=False)
    return name


def row_tuples(df) -> list[tuple]:
    """``(topic, partition, offset, key, value, timestamp µs, timestampType, headers)`` of every
    row, ordered by topic, partition, offset; bytes as ``bytes``, headers a list of pairs or None."""
    rows = (df.select("topic", "partition", "offset", "key", "value", F.unix_micros("timestamp").alias("ts"),
                      "timestampType", "headers")
            .orderBy("topic", "partition", "offset").collect())

    def b(x):
        return None if x is None else bytes(x)

    return [(r.topic, r.partition, r.offset, b(r.key), b(r.value), r.ts, r.timestampType,
             None if r.headers is None else [(h.key, b(h.value)) for h in r.headers])
            for r in rows]


# -- the ``processor backfill`` command as a subprocess; task databases as bytes ---------------------

def _root() -> str:
    """The repository root (the topology modules' import root)."""
    import os

    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def backfill_argv(spec: str, bootstrap: str, app: str, state_dir, *extra: str, master: str = "local[2]") -> list[str]:
    """``processor backfill SPEC --bootstrap-servers B --application-id A --state-dir D --master M
    EXTRA...``, through the venv's ``processor`` console script (``python -m processor.cli``
    where the script is missing)."""
    import os
    import sys

    script = os.path.join(os.path.dirname(sys.executable), "processor")
    head = [script] if os.path.exists(script) else [sys.executable, "-m", "processor.cli"]
    return [*head, "backfill", spec, "--bootstrap-servers", bootstrap, "--application-id", app,
            "--state-dir", str(state_dir), "--master", master, *extra]


def cli_env(env: dict) -> dict:
    """The environment of a command: this one, plus ``env``, the repository on PYTHONPATH (the
    topology module and Spark's Python workers import ``tests.backfill.apps``)."""
    import os
    import sys

    e = dict(os.environ, **env)
    e["PYTHONPATH"] = _root() + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("PYSPARK_PYTHON", sys.executable)
    e.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    e.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return e


def run_cli(argv: list[str], env: dict, timeout_s: float = 300):
    """Run a command to completion: ``subprocess.CompletedProcess`` (text stdout/stderr)."""
    import subprocess

    return subprocess.run(argv, cwd=_root(), env=cli_env(env), capture_output=True, text=True, timeout=timeout_s)


def start_cli(argv: list[str], env: dict, log_path):
    """Start a command in its own session (so it and everything it starts, Spark's JVM and
    Python workers included, can be found by session id), stdout and stderr to ``log_path``."""
    import subprocess

    log = open(log_path, "w")
    try:
        return subprocess.Popen(argv, cwd=_root(), env=cli_env(env), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        log.close()


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (from /proc; zombies excluded)."""
    import os

    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:    # state, ppid, pgrp, session
            out.append(int(d))
    return out


def kill_session(proc, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL ``proc`` (started by ``start_cli``), reap it, then SIGKILL by pid whatever of its
    session is still alive (Spark's JVM and Python workers) until none is. Returns the pids that
    outlived the first kill."""
    import os
    import signal
    import time

    sid = proc.pid
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    survivors = []
    deadline = time.monotonic() + timeout_s
    while True:
        pids = session_pids(sid)
        if not pids:
            return survivors
        survivors.extend(p for p in pids if p not in survivors)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of session {sid} still alive after {timeout_s:.0f} s: {pids}")
        time.sleep(0.1)


def wait_for_line(proc, log_path, pattern: str, timeout_s: float = 300.0, poll_s: float = 0.02) -> str:
    """Wait until ``log_path`` holds a line matching the regex ``pattern``; returns it. Fails
    (with the log's tail) when ``proc`` exits first or on timeout."""
    import re
    import time

    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while True:
        with open(log_path, errors="replace") as f:
            text = f.read()
        for line in text.splitlines():
            if rx.search(line):
                return line
        if proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before a line matching {pattern!r}; "
                                 f"log tail:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no line matching {pattern!r} within {timeout_s:.0f} s; log tail:\n{text[-3000:]}")
        time.sleep(poll_s)


def contract_column_families(state_dir, app: str) -> dict[str, dict[str, list[tuple[bytes, bytes]]]]:
    """``{task directory name: {column family: [(key, value)] in key order}}`` of every
    ``<state_dir>/<app>/task-*`` database, for every column family whose name does not begin with
    ``__`` (host-local) and is not RocksDB's ``default``: the bytes the backfill contract covers."""
    from pathlib import Path

    from processor.state.rocksdb import RocksDBDatabase

    out = {}
    for task_dir in sorted((Path(state_dir) / app).glob("task-*")):
        db = RocksDBDatabase(task_dir)
        try:
            out[task_dir.name] = {cf: sorted(db.store(cf).items()) for cf in sorted(db.column_families())
                                  if not cf.startswith("__") and cf != "default"}
        finally:
            db.close()
    return out


def without_application_id(cfs: dict, app: str) -> dict:
    """``contract_column_families`` output with every occurrence of ``app`` in keys and values
    replaced by ``<application-id>`` (and re-sorted): internal topic names carry the application
    id (e.g. the high-water marks of a repartition topic in ``_bookkeeping``), so two
    applications' stores after the same history are equal only up to it."""
    a, ph = app.encode(), b"<application-id>"
    return {task: {cf: sorted((k.replace(a, ph), v.replace(a, ph)) for k, v in items) for cf, items in per.items()}
            for task, per in cfs.items()}
