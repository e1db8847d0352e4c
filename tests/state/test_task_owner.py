"""Task directories written by another application or another topology
(``processor/state/task_owner.py``), on real RocksDB directories: every opener (an active task's
restore, a standby replica, the offset sums a member reports) checks the directory's
``task-owner.json`` first; a directory without one (written before markers existed) is accepted
and marked; another application's is moved aside and another topology's deleted, each with one
warning line, and the task opens on an empty database (rebuilt from its changelogs)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from processor import StreamsBuilder
from processor.runtime.standby import StandbyTasks
from processor.runtime.task_manager import TaskManager
from processor.serde import Serdes
from processor.state import task_owner
from processor.state.rocksdb import RocksDBDatabase
from processor.state.state_directory import StateDirectory
from processor.state.task_owner import MARKER, TaskOwner, claim_task_dir, owner_of


def counts(topic: str = "events"):
    b = StreamsBuilder()
    b.stream(topic, key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .group_by_key().count(name="counts").to_stream().to("out")
    return b.build()


def fill(path: Path, rows: dict[bytes, bytes], checkpoint: dict[tuple[str, int], int], store: str = "counts") -> None:
    """A task database as a worker leaves it: rows in a store, a checkpoint."""
    db = RocksDBDatabase(path)
    try:
        for k, v in rows.items():
            db.store(store).put(k, v)
        db.commit(checkpoint)
    finally:
        db.close()


def contents(path: Path, store: str = "counts") -> tuple[dict, dict]:
    db = RocksDBDatabase(path)
    try:
        return dict(db.store(store).items()), db.read_checkpoint()
    finally:
        db.close()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


APP = counts().for_application("orders")
OWNER = owner_of(APP, 0, 1)


def test_the_owner_of_a_task_and_its_codec():
    assert OWNER == TaskOwner("orders", "0_1", ("events",), ("counts", "counts.emitted"))
    raw = task_owner.encode(OWNER)
    assert json.loads(raw) == {"version": 1, "application_id": "orders", "task": "0_1", "inputs": ["events"],
                               "stores": ["counts", "counts.emitted"]}
    assert task_owner.decode(raw) == OWNER
    for bad, why in [(b"\xff", "not JSON"), (b"[1]", "not an object"), (b'{"version": 2}', "version 2"),
                     (b'{"version": 1, "application_id": 3}', "wrong type")]:
        with pytest.raises(ValueError, match=why):
            task_owner.decode(bad)
    assert owner_of(counts(), 0, 1) is None   # not bound to an application: nothing to record


def test_a_new_directory_is_marked_and_the_marker_survives_the_database(tmp_path):
    path = tmp_path / "task-0_1"
    assert claim_task_dir(path, OWNER) == "new"
    assert task_owner.read_marker(path) == OWNER
    # RocksDB leaves a file it did not write alone: through writes, flushes and reopenings
    for i in range(5):
        fill(path, {f"k{i}-{j}".encode(): b"x" * 100 for j in range(2000)}, {("events", 1): i})
    rows, checkpoint = contents(path)
    assert len(rows) == 10_000 and checkpoint == {("events", 1): 4}
    assert task_owner.read_marker(path) == OWNER
    assert claim_task_dir(path, OWNER) == "kept"


def test_a_directory_from_before_markers_is_accepted_and_marked(tmp_path, caplog):
    path = tmp_path / "task-0_1"
    fill(path, {b"a": b"1"}, {("events", 1): 7})
    assert not (path / MARKER).exists()
    assert claim_task_dir(path, OWNER) == "marked"
    assert task_owner.read_marker(path) == OWNER
    assert contents(path) == ({b"a": b"1"}, {("events", 1): 7})
    assert warnings_of(caplog) == []


def test_stores_added_keep_the_directory_and_rewrite_the_marker(tmp_path, caplog):
    path = tmp_path / "task-0_1"
    claim_task_dir(path, OWNER)
    fill(path, {b"a": b"1"}, {("events", 1): 7})
    more = TaskOwner("orders", "0_1", ("events",), (*OWNER.stores, "totals"))
    assert claim_task_dir(path, more) == "kept"
    assert task_owner.read_marker(path) == more
    assert contents(path) == ({b"a": b"1"}, {("events", 1): 7})
    assert warnings_of(caplog) == []


def test_another_applications_directory_is_moved_aside_with_one_line(tmp_path, caplog):
    root = tmp_path / "orders"
    path = root / "task-0_1"
    other = owner_of(counts().for_application("billing"), 0, 1)
    claim_task_dir(path, other)
    fill(path, {b"a": b"1"}, {("events", 1): 7, ("billing-counts-changelog", 1): 3})
    caplog.set_level(logging.INFO)
    assert claim_task_dir(path, OWNER) == "moved"
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    (aside,) = (root / "moved-aside").iterdir()
    assert aside.name.startswith("task-0_1-")
    assert lines[0] == (f"task directory {path} was written by application 'billing', task 0_1 reading events, "
                        f"not by this worker's application 'orders', task 0_1 reading events: moved aside to "
                        f"{aside} (delete it when not needed); the task's state is rebuilt from its changelogs")
    # nothing of the other application's is lost, and nothing of it is opened as this task's
    assert task_owner.read_marker(aside) == other
    assert contents(aside) == ({b"a": b"1"}, {("events", 1): 7, ("billing-counts-changelog", 1): 3})
    assert task_owner.read_marker(path) == OWNER
    assert contents(path) == ({}, {})
    assert claim_task_dir(path, OWNER) == "kept"
    # a second one the same second gets a name of its own
    fill(path, {b"b": b"2"}, {})
    task_owner.write_marker(path, other)
    assert claim_task_dir(path, OWNER) == "moved"
    assert len(list((root / "moved-aside").iterdir())) == 2


def test_another_tasks_directory_and_an_unreadable_marker_are_moved_aside(tmp_path, caplog):
    path = tmp_path / "task-0_1"
    fill(path, {b"a": b"1"}, {("events", 2): 7})
    task_owner.write_marker(path, owner_of(APP, 0, 2))   # task-0_2 renamed
    assert claim_task_dir(path, OWNER) == "moved"
    fill(path, {b"a": b"1"}, {("events", 1): 7})
    (path / MARKER).write_text('{"version": 9}')
    assert claim_task_dir(path, OWNER) == "moved"
    lines = warnings_of(caplog)
    assert len(lines) == 2
    assert "written by application 'orders', task 0_2 reading events, not by this worker's" in lines[0]
    assert f"written by a marker it cannot read ({MARKER}: version 9, this build reads version 1)" in lines[1]
    assert contents(path) == ({}, {})


def test_another_topology_of_the_application_is_deleted_with_one_line(tmp_path, caplog):
    """Sub-topology 0 read ``clicks`` when the directory was written; now it reads ``events``."""
    path = tmp_path / "task-0_1"
    before = owner_of(counts(topic="clicks").for_application("orders"), 0, 1)
    claim_task_dir(path, before)
    fill(path, {b"a": b"1"}, {("clicks", 1): 7})
    assert claim_task_dir(path, OWNER) == "wiped"
    assert warnings_of(caplog) == [
        f"task directory {path} was written by another topology of application 'orders' (task 0_1 read clicks; it "
        f"now reads events): deleted; the task's state is rebuilt from the application's changelogs (which hold the "
        f"old topology's state too: an incompatible topology needs a new application id or a reset)"]
    assert contents(path) == ({}, {})
    assert task_owner.read_marker(path) == OWNER
    assert not (tmp_path / "moved-aside").exists()


def test_every_opener_checks(tmp_path, caplog):
    """The active restore (``TaskManager``), a standby replica and the offset sums a member
    reports open no directory another application wrote; this application's are opened as they are."""
    state = tmp_path / "orders"
    foreign = owner_of(counts().for_application("billing"), 0, 0)
    for p in range(3):
        path = state / f"task-0_{p}"
        claim_task_dir(path, foreign if p == 0 else owner_of(APP, 0, p))
        fill(path, {b"a": b"1"}, {("orders-counts-changelog", p): 5, ("events", p): 9})
    # the offset sums a member reports: task 0_0's directory is another application's
    sums = StateDirectory(state, APP).offset_sums({(0, 0), (0, 1), (0, 2)})
    assert sums == {(0, 1): 5, (0, 2): 5}
    assert len(warnings_of(caplog)) == 1
    # a standby replica
    task_owner.write_marker(state / "task-0_1", foreign)
    standby = StandbyTasks(APP, state, {}, threading.Event())
    try:
        standby.update({(0, 1)})
        assert standby.offset_sums() == {(0, 1): 0}
        assert dict(standby.dbs[(0, 1)].store("counts").items()) == {}
    finally:
        standby.close()
    # an active task's restore
    task_owner.write_marker(state / "task-0_2", foreign)
    tm = TaskManager(APP, application_id="orders", bootstrap_servers="unused:1", state_dir=state,
                     isolation_level="read_uncommitted", on_error="fail", dlq_topic="dlq", producer_config={},
                     stage_internal=True, coalesce_fk_records=True, max_task_idle_ms=0, stop=threading.Event())
    targets = tm._restore_targets([(0, 2)])
    try:
        assert targets[0].local == {}
        assert dict(targets[0].db.store("counts").items()) == {}
    finally:
        for t in targets:
            t.db.close()
    assert len(warnings_of(caplog)) == 3
    assert len(list((state / "moved-aside").iterdir())) == 3
