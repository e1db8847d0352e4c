"""A worker's identity: the id its state directory keeps, and the live process that claims it.

Invariants:

1. **One id per state directory, kept whole.** ``<state-dir>/<application-id>/worker.id`` holds
   one line, the id: 1-64 characters of ``[A-Za-z0-9._-]``, starting with a letter or digit
   (the transactional id's and the static member's suffix, so a restarted worker fences its own
   zombie). A new one is a random UUID written atomically (a temporary file, fsync, a link that
   never replaces, fsync of the directory), readable by its owner only; a crash never leaves half
   an id, and workers creating it at once (threads of one process) all get the same one. A file
   that breaks the rule (empty, binary, too long) stops the worker with one line naming it
   (``StateDirUnusable``, exit 4), never a traceback or an id like ``app1-``.
2. **Owner-only state.** The application's state directory is created with mode 0700 (an
   existing one keeps its owner's choice): its databases, checkpoints and lock are readable by
   their owner only.
3. **One live process per id.** Each process has an ``instance`` (``pid.started@host#token``) and the
   time it claimed the id; a worker reports both in its subscription
   (``processor/runtime/membership.py``). A state directory copied with its ``worker.id`` gives
   two live processes one id: at start-up a worker that finds its id claimed by a live member of
   its group, another instance, stops with one line naming both (before it initialises
   transactions, which would fence the other); two started at once are told apart by the
   group's leader, which keeps the instance that claimed the id first and refuses the other
   (``CopiedStateDir``, exit 4). Members of one process (workers in threads) share the instance.
4. **An unusable directory is one line.** A state directory that is read-only, full or not
   ours to write raises ``StateDirUnusable`` (exit 4) naming the path and the cause.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
import uuid
from pathlib import Path

from processor.errors import StateDirUnusable

ID_FILE = "worker.id"
ID_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
# errors of a state directory that no retry mends: not writable, full, over quota, read-only
UNUSABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)

_instance: tuple[int, str, int] | None = None


def _started(pid: int) -> str | None:
    """When process ``pid`` of this host started (clock ticks since boot, /proc/<pid>/stat's 22nd
    field), or None: no such process, one that has exited (a zombie its parent has not reaped
    yet), or no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()   # (the fields after the command name, which may hold spaces)
    if fields[0] in ("Z", "X"):   # exited: a zombie, or dead
        return None
    return fields[19]


def process_instance() -> tuple[str, int]:
    """This process's ``(instance, claimed_at_ms)``: ``pid.started@host#token`` (``started``: the
    process's start time, so a reused pid is another process), and when it was first asked for
    (per process: a forked child gets its own)."""
    global _instance
    pid = os.getpid()
    if _instance is None or _instance[0] != pid:
        _instance = (pid, f"{pid}.{_started(pid) or 0}@{socket.gethostname()}#{uuid.uuid4().hex[:8]}",
                     int(time.time() * 1000))
    return _instance[1], _instance[2]


def on_this_host(instance: str) -> bool:
    """Whether ``instance`` (another member's report) names a process of this host."""
    return instance.partition("@")[2].rpartition("#")[0] == socket.gethostname()


def is_gone(instance: str) -> bool:
    """Whether ``instance`` is a process of this host that no longer runs: its pid runs no process
    started when it did (exited, or the pid reused), or is this very process's pid (an earlier
    incarnation of a restarted container). Another host's, or a report this cannot read: False."""
    if not on_this_host(instance):
        return False
    pid_text, _, started = instance.partition("@")[0].partition(".")
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    return pid == os.getpid() or _started(pid) != started


def unusable(path: Path, exc: OSError, doing: str) -> StateDirUnusable:
    """The one-line error of a state directory ``path`` that failed ``doing`` with ``exc``."""
    return StateDirUnusable(f"state directory {path} cannot be used: {doing} failed: "
                            f"{exc.strerror or exc} (errno {exc.errno}); give the worker a writable --state-dir "
                            f"with free space")


def prepare_directory(path: Path) -> None:
    """Create ``path`` (and its parents), owner-only (invariant 2); an existing directory keeps
    the mode its owner gave it (a sidecar of the same group may read it). An OS error is
    ``StateDirUnusable``."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=DIRECTORY_MODE)
    except OSError as exc:
        raise unusable(path, exc, "creating it") from None


def worker_id(state_dir: Path) -> str:
    """The id kept in ``state_dir`` (created on first use; invariant 1)."""
    path = state_dir / ID_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _create(state_dir, path)
    except OSError as exc:
        raise unusable(state_dir, exc, f"reading {ID_FILE}") from None
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = None
    if text is None or not ID_RULE.fullmatch(text):
        shown = repr(raw[:40]) + ("..." if len(raw) > 40 else "")
        raise StateDirUnusable(f"{path} does not hold a worker id ({shown}): an id is 1-64 characters of "
                               f"A-Z a-z 0-9 . _ -, starting with a letter or digit; delete the file for a new "
                               f"one (a restarted worker then no longer fences its own zombie by id)")
    return text


def _create(state_dir: Path, path: Path) -> str:
    """A new id, written whole: a temporary file of this writer's own, fsynced, then linked to
    ``worker.id`` (a link never replaces: of writers racing, threads of one process or
    processes, the first wins and the others read its id), the directory fsynced."""
    prepare_directory(state_dir)
    new = uuid.uuid4().hex
    tmp = state_dir / f".{ID_FILE}.{new}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            os.write(fd, (new + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:   # another writer's id won
            return worker_id(state_dir)
        dir_fd = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise unusable(state_dir, exc, f"writing {ID_FILE}") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
    return new


def copied_state_dir_message(worker_id: str, state_dir: Path | str, other: str, other_since: int | None) -> str:
    """The one line of a worker refused because ``other`` (an instance) claims its id."""
    since = "" if other_since is None else \
        f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(other_since / 1000))} UTC"
    return (f"worker id {worker_id} (state directory {state_dir}) is claimed by another live worker, "
            f"{other}{since}: the state directory was copied with its {ID_FILE}; give this worker a state "
            f"directory of its own (or delete {ID_FILE} in the copy)")
