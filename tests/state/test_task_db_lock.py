"""A task database another worker of this process still has open (workers in threads sharing a
state directory: the task moved, its old owner closes it in its own main loop) is waited for
(``StateDirectory.open``, up to the task manager's ``DB_LOCK_WAIT_S``), not a fatal error; other
failures are not."""

from __future__ import annotations

import threading
import time

import pytest

from processor.errors import StateError
from processor.runtime import task_manager as tm_module
from processor.runtime.task_manager import TaskManager
from processor.state.rocksdb import RocksDBDatabase
from tests.state.test_task_owner import APP


def _manager(state, stop=None) -> TaskManager:
    return TaskManager(APP, application_id="orders", bootstrap_servers="unused:1", state_dir=state,
                       isolation_level="read_uncommitted", on_error="fail", dlq_topic="dlq", producer_config={},
                       stage_internal=True, coalesce_fk_records=True, max_task_idle_ms=0,
                       stop=stop or threading.Event())


def _open(tm: TaskManager) -> RocksDBDatabase:
    """Task 0_1's database, opened as the task manager opens an active task's."""
    return tm.state_directory.open((0, 1), tm_module.DB_LOCK_WAIT_S, tm.stop)


def test_a_database_still_open_in_this_process_is_waited_for(tmp_path):
    path = tmp_path / "orders" / "task-0_1"
    held = RocksDBDatabase(path)   # the old owner's
    closer = threading.Timer(0.5, held.close)
    closer.start()
    t0 = time.monotonic()
    db = _open(_manager(tmp_path / "orders"))
    try:
        assert 0.4 < time.monotonic() - t0 < 10
    finally:
        db.close()
        closer.join()


def test_a_lock_held_past_the_wait_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tm_module, "DB_LOCK_WAIT_S", 0.3)
    path = tmp_path / "orders" / "task-0_1"
    held = RocksDBDatabase(path)
    try:
        with pytest.raises(StateError, match="lock hold by current process"):
            _open(_manager(tmp_path / "orders"))
    finally:
        held.close()
