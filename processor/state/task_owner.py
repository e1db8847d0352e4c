"""Who wrote a task directory: the ``task-owner.json`` marker, and the check made before a worker
opens a task's database (an active task's restore, a standby replica, the state a member reports).

A task directory ``<state-dir>/<application-id>/task-<sub>_<partition>`` holds the task's stores,
its input positions and changelog checkpoints (``processor/state/rocksdb.py``). Its contents mean
something only to the application and the sub-topology that wrote them: a directory copied from
another application (a restored backup, a renamed application directory) carries that
application's input positions, and a worker that trusted them would skip every record before them
and keep the other application's rows beside its own. So every task directory records its writer,
and a directory written by another one is put out of the way before the database opens; the task
is then rebuilt from its changelogs, which are the truth (nothing is lost).

The marker: ``<task dir>/task-owner.json``, UTF-8 JSON, written atomically (a temporary file, then
a rename) when the directory is created or first checked::

    {"version": 1, "application_id": "orders", "task": "0_3",
     "inputs": ["orders", "orders-totals-repartition"], "stores": ["totals"]}

``inputs``: the sub-topology's source topics, sorted (what the task's input positions refer to;
a topic is read by one sub-topology only, so they identify it); ``stores``: its stores, sorted
(recorded, not compared). A marker of another version, or one that does not parse, names no
writer this build knows. (RocksDB ignores files of the directory it did not write, as it does
rocksdict's own ``rocksdict-config.json``.)

The rule (``claim_task_dir``), for the task ``owner`` about to be opened on ``path``:

1. no directory, or one without a database: it is made, with the marker;
2. a directory without a marker (written before markers existed, or by a backfill): accepted as
   this task's, and marked;
3. the marker names this application and task, and the same inputs: kept (the marker is rewritten
   when the stores changed: a store added is restored from its changelog from scratch, as always;
   a store dropped stays unused in the directory);
4. another application, another task, or a marker that cannot be read: the directory is moved
   aside, to ``<application dir>/moved-aside/task-<sub>_<partition>-<UTC time>`` (it is not this
   application's to delete), and a new one is made;
5. this application and task, other inputs (another topology: its sub-topologies renumbered or
   rewired): the directory is deleted (everything it held is in this application's changelogs),
   and a new one is made.

Cases 4 and 5 each log one warning line naming the directory, what wrote it and what runs now.
Kafka Streams keeps no such record: its state directory is per ``application.id`` and it ignores
checkpoint offsets of stores it does not know; it wipes a task directory only when its stores'
checkpoints cannot be trusted (``TaskCorruptedException``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from processor.engine.task_id import TaskId

if TYPE_CHECKING:
    from processor.topology.core import Topology

log = logging.getLogger("processor.state")

MARKER = "task-owner.json"
VERSION = 1
MOVED_ASIDE = "moved-aside"

Verdict = Literal["new", "marked", "kept", "moved", "wiped"]


@dataclass(frozen=True)
class TaskOwner:
    """What wrote (or opens) a task directory."""

    application_id: str
    task: str                     # "<sub>_<partition>"
    inputs: tuple[str, ...]       # the sub-topology's source topics, sorted
    stores: tuple[str, ...] = ()  # its stores, sorted (recorded, not compared)

    def describe(self) -> str:
        return f"application {self.application_id!r}, task {self.task} reading {', '.join(self.inputs) or 'nothing'}"


def owner_of(topology: Topology, sub: int, partition: int) -> TaskOwner | None:
    """The owner of task ``sub_partition`` of ``topology`` (None for a topology not bound to an
    application: nothing to record)."""
    if topology.application_id is None:
        return None
    return TaskOwner(topology.application_id, str(TaskId(sub, partition)), tuple(sorted(topology.source_topics(sub))),
                     tuple(sorted(s.name for s in topology.stores_of(sub))))


def encode(owner: TaskOwner) -> bytes:
    return (json.dumps({"version": VERSION, "application_id": owner.application_id, "task": owner.task,
                        "inputs": list(owner.inputs), "stores": list(owner.stores)}, sort_keys=True) + "\n").encode()


def decode(raw: bytes) -> TaskOwner:
    """The marker's owner; ``ValueError`` naming what is wrong with it."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r}, this build reads version {VERSION}")
    app, task, inputs, stores = (doc.get(k) for k in ("application_id", "task", "inputs", "stores"))
    if not isinstance(app, str) or not isinstance(task, str) or not isinstance(inputs, list) \
            or not all(isinstance(t, str) for t in inputs) or not isinstance(stores, list) \
            or not all(isinstance(s, str) for s in stores):
        raise ValueError("application_id, task, inputs or stores missing or of the wrong type")
    return TaskOwner(app, task, tuple(inputs), tuple(stores))


def read_marker(path: Path) -> TaskOwner | None:
    """The owner recorded in task directory ``path`` (None: no marker); ``ValueError`` for a
    marker that cannot be read."""
    try:
        raw = (path / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    return decode(raw)


def write_marker(path: Path, owner: TaskOwner) -> None:
    tmp = path / (MARKER + ".tmp")
    tmp.write_bytes(encode(owner))
    os.replace(tmp, path / MARKER)


def claim_task_dir(path: Path, owner: TaskOwner | None) -> Verdict:
    """Make ``path`` fit to be opened as ``owner``'s task directory (the module docstring's rule);
    returns which case applied. ``owner`` None: nothing is checked or written (``"kept"``)."""
    if owner is None:
        return "kept"
    path = Path(path)
    if not (path / "CURRENT").exists():   # no database here (yet)
        path.mkdir(parents=True, exist_ok=True)
        write_marker(path, owner)
        return "new"
    try:
        found = read_marker(path)
        unreadable = None
    except (OSError, ValueError) as exc:
        found, unreadable = None, f"a marker it cannot read ({MARKER}: {exc})"
    if found is None and unreadable is None:
        write_marker(path, owner)
        return "marked"
    if found is not None and (found.application_id, found.task, found.inputs) == \
            (owner.application_id, owner.task, owner.inputs):
        if found.stores != owner.stores:
            write_marker(path, owner)
        return "kept"
    if found is not None and (found.application_id, found.task) == (owner.application_id, owner.task):
        shutil.rmtree(path)
        path.mkdir(parents=True)
        write_marker(path, owner)
        log.warning("task directory %s was written by another topology of application %r (task %s read %s; it now "
                    "reads %s): deleted; the task's state is rebuilt from the application's changelogs (which hold the "
                    "old topology's state too: an incompatible topology needs a new application id or a reset)", path,
                    owner.application_id, owner.task, ", ".join(found.inputs) or "nothing",
                    ", ".join(owner.inputs) or "nothing")
        return "wiped"
    dest = _aside(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, dest)
    path.mkdir(parents=True)
    write_marker(path, owner)
    writer = found.describe() if found is not None else unreadable
    log.warning("task directory %s was written by %s, not by this worker's %s: moved aside to %s (delete it "
                "when not needed); the task's state is rebuilt from its changelogs", path, writer,
                owner.describe(), dest)
    return "moved"


def _aside(path: Path) -> Path:
    """A free name for ``path`` under ``<its parent>/moved-aside/``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = path.parent / MOVED_ASIDE / f"{path.name}-{stamp}"
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}-{n}")
    return dest
