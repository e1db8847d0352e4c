"""Looking inside a stopped worker's (or a backfill's) state directory: ``processor state dump``
and ``processor state stats``.

Invariants: a task database is only ever opened read-only (RocksDB's read-only mode: no write,
no compaction, no new file in it; rocksdict rewrites its own ``rocksdict-config.json`` with the
same contents on every open); a state directory that a running worker holds is refused
(``StateDirLocked``, exit 4) by taking the worker's own lock for the time of the read.

``dump`` prints one JSON line per entry, ``{"task", "store", "key", "value", "timestamp"}`` (a
global table's entries with ``"task": "global"``),
decoded with the topology's serdes as the test driver's stores are (a last-emitted column:
``value`` and ``timestamp`` of what was emitted, plus ``emitted_at``; a Processor API window or
session store's entry: its window or session bounds beside the key); an entry its serdes cannot
decode, and every entry with ``raw``, is printed as hex (``key_hex``, ``value_hex``). With
``raw`` every column family is printed, the host-local ones (``__``) and ``_bookkeeping`` too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import rocksdict

from processor.engine.task_id import DIR_GLOB, TaskId
from processor.errors import ConfigError
from processor.runtime.state_lock import StateDirLock
from processor.state import emitted as emitted_codec
from processor.state import timestamped


def task_dirs(state_dir, application_id: str) -> list[Path]:
    root = Path(state_dir) / application_id
    if not root.is_dir():
        raise ConfigError(f"no state of application {application_id!r} in {state_dir} (no directory {root})")
    return sorted(p for p in root.glob(DIR_GLOB)
                  if TaskId.of_dirname(p.name) is not None and p.is_dir() and (p / "CURRENT").exists())


def _read_only(path: Path):
    opts = rocksdict.Options(raw_mode=True)
    cfs = [c for c in rocksdict.Rdict.list_cf(str(path)) if c != "default"]
    db = rocksdict.Rdict(str(path), opts, column_families={c: rocksdict.Options(raw_mode=True) for c in cfs},
                         access_type=rocksdict.AccessType.read_only())
    return db, cfs


def _entries(topology, application_id, state_dir, store=None, task=None):
    """``(task id, column family, spec or None, key bytes, value bytes)`` of every entry: the
    tasks' databases, then the global tables' (``<state-dir>/<app>/global``, task ``global``)."""
    topology = topology.for_application(application_id)
    dirs = [(d, str(TaskId.of_dirname(d.name)), topology.stores) for d in task_dirs(state_dir, application_id)]
    global_dir = Path(state_dir) / application_id / "global"
    if (global_dir / "CURRENT").exists():
        dirs.append((global_dir, "global", topology.global_stores))
    if task is not None:
        dirs = [x for x in dirs if x[1] == task]
        if not dirs:
            raise ConfigError(f"no task {task} in {Path(state_dir) / application_id}")
    for d, task_id, specs in dirs:
        db, cfs = _read_only(d)
        try:
            for cf in sorted(cfs):
                if store is not None and cf != store:
                    continue
                for k, v in db.get_column_family(cf).items():
                    yield task_id, cf, specs.get(cf), k, v
        finally:
            db.close()


def decode_entry(spec, k: bytes, v: bytes) -> dict:
    if spec.kind in ("window", "session"):     # Processor API window / session stores
        return _decode_windowed(spec, k, v)
    out = {"key": spec.key_serde.deserialize(k)}
    if spec.kind in ("version", "subscription"):      # a foreign-key join's own bytes
        out["key_hex"], out["value_hex"] = k.hex(), v.hex()
        del out["key"]
    elif spec.kind == "emitted":
        e = emitted_codec.decode(v)
        out.update(value=None if e.value is None else spec.value_serde.deserialize(e.value),
                   timestamp=e.timestamp, emitted_at=e.emitted_at)
    else:
        ts, vb = timestamped.decode(v)
        out.update(value=spec.value_serde.deserialize(vb), timestamp=ts)
    return out


def _decode_windowed(spec, k: bytes, v: bytes) -> dict:
    """``{"key", "window_start", "window_end", ("seq",) "value", "timestamp"}`` of a window store
    entry (``seq`` where it retains duplicates), ``{"key", "session_start", "session_end", ...}``
    of a session store's (``processor/state/papi_window_key.py``). Every stored entry is printed,
    expired ones not purged yet too (a store purges a segment at a time)."""
    ts, vb = timestamped.decode(v)
    if spec.kind == "window":
        windowed, seq = spec.key_serde.deserialize(k)
        out = {"key": windowed.key, "window_start": windowed.start, "window_end": windowed.end}
        if spec.key_serde.retain_duplicates:
            out["seq"] = seq
    else:
        windowed = spec.key_serde.deserialize(k)
        out = {"key": windowed.key, "session_start": windowed.start, "session_end": windowed.end}
    out.update(value=spec.value_serde.deserialize(vb), timestamp=ts)
    return out


def dump(topology, application_id: str, state_dir, store: str | None = None, task: str | None = None,
         raw: bool = False, out=None) -> int:
    """Print the entries as JSON lines; returns how many."""
    out = out or sys.stdout
    names = sorted(topology.stores) + sorted(topology.global_stores)
    if store is not None and store not in names and not raw:
        raise ConfigError(f"no store named {store!r} (stores: {names}); --raw prints any column family")
    n = 0
    task_dirs(state_dir, application_id)      # (refuses a missing directory before locking it)
    with StateDirLock(Path(state_dir) / application_id):
        for task_id, cf, spec, k, v in _entries(topology, application_id, state_dir, store, task):
            if spec is None and not raw:
                continue       # bookkeeping and host-local column families: with --raw
            line = {"task": task_id, "store": cf}
            if raw or spec is None:
                line.update(key_hex=k.hex(), value_hex=v.hex())
            else:
                try:
                    line.update(decode_entry(spec, k, v))
                except Exception as exc:   # not this topology's bytes: show them as they are
                    line.update(key_hex=k.hex(), value_hex=v.hex(), undecoded=f"{type(exc).__name__}: {exc}")
            out.write(json.dumps(line, default=repr, sort_keys=False) + "\n")
            n += 1
    return n


def stats(topology, application_id: str, state_dir) -> list[dict]:
    """Entries and bytes (keys + values) per task and column family."""
    rows: dict[tuple[str, str], list[int]] = {}
    task_dirs(state_dir, application_id)
    with StateDirLock(Path(state_dir) / application_id):
        for task_id, cf, _spec, k, v in _entries(topology, application_id, state_dir):
            r = rows.setdefault((task_id, cf), [0, 0])
            r[0] += 1
            r[1] += len(k) + len(v)
    return [{"task": t, "store": s, "entries": e, "bytes": b} for (t, s), (e, b) in sorted(rows.items())]
