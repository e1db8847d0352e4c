"""One worker process per state directory.

A worker keeps one RocksDB database per task under ``<state-dir>/<application-id>/``. Two worker
processes started on the same directory (a copy-pasted ``--state-dir``, a restart while the old
process is still shutting down) would open the same task databases, each writing its own state
and input positions and replaying or skipping records by the other's checkpoints: corrupted
stores and lost or duplicated outputs, found long after. So the worker takes an exclusive lock on
``<dir>/.lock`` before it touches anything, and a second process is refused at once with one
line naming the directory and the holder (exit code 4, ``StateDirLocked``).

The lock is ``flock(LOCK_EX | LOCK_NB)``: the kernel drops it when the holder dies, even on
SIGKILL, so a crash never leaves a stale lock behind; the ``pid=<pid> host=<hostname>`` written
into the file is only there to name the holder. (flock over NFS is not dependable: keep state
directories on local disks.)

The lock belongs to the process: several workers in one process (threads, as the stream threads
of one Kafka Streams instance) share it, and it is released when the last of them releases it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from pathlib import Path

from processor.errors import StateDirLocked

LOCK_FILE = ".lock"

# (pid, real path of the lock file) -> [fd, holders]; keyed by pid so that a forked child,
# which inherits this dict, does not believe it holds its parent's lock.
_held: dict[tuple[int, str], list[int]] = {}
_held_guard = threading.Lock()


def _holder(fd: int) -> str:
    """``pid 123 on host h`` from the lock file (the holder writes it right after locking)."""
    text = ""
    for _ in range(10):  # the holder may be between locking and writing
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace").strip()
        if text:
            break
        time.sleep(0.02)
    fields = dict(part.partition("=")[::2] for part in text.split())
    if "pid" not in fields:
        return "holder unknown"
    return f"pid {fields['pid']} on host {fields.get('host', '?')}"


class StateDirLock:
    """Exclusive (per process) lock on a state directory; ``with StateDirLock(path): ...`` or
    ``acquire()`` / ``release()``. ``acquire`` creates the directory and raises ``StateDirLocked``
    at once if another process holds it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._key: tuple[int, str] | None = None

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    def acquire(self) -> StateDirLock:
        if self._key is not None:
            return self
        from processor.runtime.worker_identity import prepare_directory, unusable

        prepare_directory(self.path)   # (owner-only; read-only or full: one line, exit 4)
        key = (os.getpid(), os.path.realpath(self.lock_file))
        with _held_guard:
            entry = _held.get(key)
            if entry is not None:
                entry[1] += 1
                self._key = key
                return self
            try:
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise unusable(self.path, exc, f"opening {LOCK_FILE}") from None
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise StateDirLocked(
                        f"state directory {self.path} is locked by another worker ({_holder(fd)}); "
                        f"give each worker its own --state-dir") from None
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"pid={os.getpid()} host={socket.gethostname()}\n".encode(), 0)
                except OSError as exc:
                    raise unusable(self.path, exc, f"writing {LOCK_FILE}") from None
            except BaseException:
                os.close(fd)
                raise
            _held[key] = [fd, 1]
            self._key = key
        return self

    def release(self) -> None:
        """Give the lock up (the last holder in this process unlocks the file); idempotent."""
        key, self._key = self._key, None
        if key is None:
            return
        with _held_guard:
            entry = _held.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _held[key]
            fd = entry[0]
            try:
                os.ftruncate(fd, 0)  # no stale holder name once nobody holds it
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @property
    def held(self) -> bool:
        return self._key is not None

    def __enter__(self) -> StateDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
