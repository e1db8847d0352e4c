"""StateDirLock: one process per state directory, refused at once with the holder named; the
kernel drops the lock with its holder; shared by the workers (threads) of one process."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from processor.errors import StateDirLocked, StateError
from processor.runtime.state_lock import StateDirLock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Another process: try to lock argv[1]; print the outcome; hold it until stdin has a line.
OTHER = """
import sys
from processor.runtime.state_lock import StateDirLock
lock = StateDirLock(sys.argv[1])
try:
    lock.acquire()
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
    sys.exit(getattr(exc, "exit_code", 1))
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""


def other_process(path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-c", OTHER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def try_in_other_process(path) -> tuple[int, str]:
    """(exit code, first line) of another process trying to take the lock (released at once)."""
    p = other_process(path)
    first = p.stdout.readline().strip()
    p.communicate("\n", timeout=30)
    return p.returncode, first


def test_other_process_is_refused_while_held_and_admitted_after_release(tmp_path):
    path = tmp_path / "state" / "app"   # created by acquire
    lock = StateDirLock(path).acquire()
    assert (path / ".lock").read_text() == f"pid={os.getpid()} host={socket.gethostname()}\n"
    rc, line = try_in_other_process(path)
    assert rc == 4
    assert line == (f"StateDirLocked: state directory {path} is locked by another worker "
                    f"(pid {os.getpid()} on host {socket.gethostname()}); give each worker its own --state-dir")
    lock.release()
    assert (path / ".lock").read_text() == ""   # no stale holder
    assert try_in_other_process(path) == (0, "locked")
    lock.acquire()   # a released lock can be taken again
    lock.release()


def test_lock_held_by_another_process_names_it_and_is_dropped_when_it_dies(tmp_path):
    holder = other_process(tmp_path)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateDirLocked, match=rf"is locked by another worker \(pid {holder.pid} on host ") as err:
            StateDirLock(tmp_path).acquire()
        assert isinstance(err.value, StateError) and err.value.exit_code == 4
        assert "\n" not in str(err.value)
        holder.send_signal(signal.SIGKILL)   # no release: the kernel drops the lock
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with StateDirLock(tmp_path) as lock:
        assert lock.held
        assert (tmp_path / ".lock").read_text().startswith(f"pid={os.getpid()} ")
    assert not lock.held


def test_workers_of_one_process_share_the_lock(tmp_path):
    a = StateDirLock(tmp_path).acquire()
    b = StateDirLock(tmp_path).acquire()   # another worker (thread) of this process
    a.release()
    assert try_in_other_process(tmp_path)[0] == 4   # still held by b
    a.release()   # idempotent: does not release b's share
    assert try_in_other_process(tmp_path)[0] == 4
    b.release()
    assert try_in_other_process(tmp_path) == (0, "locked")


def test_different_directories_do_not_conflict(tmp_path):
    with StateDirLock(tmp_path / "app-a"):
        assert try_in_other_process(tmp_path / "app-b") == (0, "locked")
