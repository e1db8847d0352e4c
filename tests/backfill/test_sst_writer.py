"""backfill/sst.py on real rocksdict databases in tmp_path: a task database built from sorted
entries through SST files is the one the worker's own RocksDBDatabase opens, holding exactly the
input (as ordered lists) and the checkpoint; unsorted input and an occupied target are refused."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from backfill.sst import (
    build_task_database,
    install_task_databases,
    new_build_root,
    write_sst,
)
from processor.engine.task_id import TaskId
from processor.errors import ConfigError, StateDirLocked
from processor.state.rocksdb import FORMAT_VERSION, RocksDBDatabase
from processor.state.store import TASK_STORE

# bytewise order: the empty key first, prefixes before their extensions, bytes >= 0x80 after
# every ASCII byte (a signed-char comparator would put them first)
KEYS = [b"", b"\x00", b"\x00\x00", b"a", b"ab", b"abc", b"abd", b"b", b"\x7f", b"\x80",
        b"\x80\x00", b"\x80\x01", b"\xfe", b"\xff", b"\xff\xff"]
assert KEYS == sorted(KEYS)


def column_families() -> dict[str, list[tuple[bytes, bytes]]]:
    return {
        "counts": [(k, b"count:" + k) for k in KEYS],
        "app.counts.v2": [(k, bytes(reversed(k)) + b"\x00\xff") for k in KEYS],
        TASK_STORE: [(b"commit", b"\x01\x02"), (b"stream_time\x00orders", (2 ** 40).to_bytes(8, "big"))],
        "empty.store": [],
        "values.empty": [(b"k", b"")],
    }


CHECKPOINT = {("orders", 3): 42, ("app-counts-changelog", 3): 15, ("topic.with.dots", 3): 2 ** 40,
              ("app-__task-0-changelog", 3): 0}


def read_all(db: RocksDBDatabase, names) -> dict[str, list[tuple[bytes, bytes]]]:
    return {name: list(db.store(name).items()) for name in names}


def build_and_install(state_dir, cfs, checkpoint=CHECKPOINT, app="app", task=(0, 3), force=False):
    root = new_build_root(state_dir, app)
    build_task_database(root / TaskId(*task).dirname, {n: iter(e) for n, e in cfs.items()}, checkpoint)
    return install_task_databases(root, state_dir, app, force=force)


def test_built_database_opens_with_the_worker_class_holding_exactly_the_input(tmp_path):
    cfs = column_families()
    state = tmp_path / "state"
    [installed] = build_and_install(state, cfs)
    assert installed == state / "app" / "task-0_3"
    assert sorted(p.name for p in state.iterdir()) == ["app"]           # build root gone
    assert [p.name for p in (state / "app").iterdir()] == ["task-0_3"]

    db = RocksDBDatabase(installed)   # opens: the build closed every handle (LOCK released)
    try:
        assert set(db.column_families()) == {"default", "__meta", "__checkpoint", *cfs}
        assert read_all(db, cfs) == cfs
        assert db.read_checkpoint() == CHECKPOINT
        assert db.store("__meta").get(b"format_version") == bytes([FORMAT_VERSION])
        assert [k for k, _ in db.store("counts").prefix(b"ab")] == [b"ab", b"abc", b"abd"]
        assert [k for k, _ in db.store("counts").prefix(b"\x80")] == [b"\x80", b"\x80\x00", b"\x80\x01"]
        assert [k for k, _ in db.store("counts").range(b"b", b"\x80\x01")] == \
            [b"b", b"\x7f", b"\x80", b"\x80\x00"]
        # ingested with the worker's table options: the SST carries the bloom filter
        props = db._cf("counts").property_value("rocksdb.aggregated-table-properties")
        assert "filter block size=" in props and "filter block size=0;" not in props
    finally:
        db.close()


def test_backfilled_database_equals_the_one_the_worker_writes(tmp_path):
    """Backfill vs live: the same stores written through RocksDBDatabase's own put + commit."""
    cfs = column_families()
    live = RocksDBDatabase(tmp_path / "live")
    live.store(TASK_STORE)            # every worker task opens it
    for name, entries in cfs.items():
        live.store(name).put_all(entries)
    live.commit(CHECKPOINT)
    live.close()
    [built] = build_and_install(tmp_path / "state", cfs)

    everything = [*cfs, "__meta", "__checkpoint"]
    a, b = RocksDBDatabase(tmp_path / "live"), RocksDBDatabase(built)
    try:
        assert sorted(a.column_families()) == sorted(b.column_families())
        assert read_all(a, everything) == read_all(b, everything)
        assert a.read_checkpoint() == b.read_checkpoint() == CHECKPOINT
    finally:
        a.close()
        b.close()


def test_unsorted_or_repeated_keys_raise_naming_them_and_leave_no_file(tmp_path):
    path = tmp_path / "x.sst"
    with pytest.raises(ValueError, match=r"b'abc'.*sorts before.*b'abd'"):
        write_sst(path, [(b"ab", b"1"), (b"abd", b"2"), (b"abc", b"3")])
    assert not path.exists()
    with pytest.raises(ValueError, match=r"b'ab'.*repeats.*b'ab'"):
        write_sst(path, [(b"ab", b"1"), (b"ab", b"2")])
    # unsigned bytes: 0x80 sorts after every ASCII key, not before
    with pytest.raises(ValueError, match=r"b'ab'.*sorts before.*b'\\x80'"):
        write_sst(path, [(b"\x80", b"1"), (b"ab", b"2")])
    with pytest.raises(ValueError, match=r"b'ab'.*sorts before.*b'abc'"):
        write_sst(path, [(b"abc", b"1"), (b"ab", b"2")])
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_unsorted_column_family_fails_the_build_leaving_nothing(tmp_path):
    cfs = column_families()
    cfs["app.counts.v2"] = list(reversed(cfs["app.counts.v2"]))
    root = new_build_root(tmp_path / "state", "app")
    with pytest.raises(ValueError, match="strictly ascending"):
        build_task_database(root / "task-0_3", cfs, CHECKPOINT)
    assert list(root.iterdir()) == []       # no database, no .partial, no staged SSTs
    with pytest.raises(ConfigError, match="no built task directory"):
        install_task_databases(root, tmp_path / "state", "app")
    assert not (tmp_path / "state" / "app").exists()


def test_empty_entries_write_no_file_but_the_column_family_exists(tmp_path):
    assert write_sst(tmp_path / "e.sst", []) is None
    assert write_sst(tmp_path / "e.sst", iter(())) is None
    assert not (tmp_path / "e.sst").exists()
    db_path = build_task_database(tmp_path / "task-1_0", {"only.empty": []}, {})
    db = RocksDBDatabase(db_path)
    try:
        assert set(db.column_families()) == {"default", "__meta", "__checkpoint", TASK_STORE, "only.empty"}
        assert list(db.store("only.empty").items()) == []
        assert db.read_checkpoint() == {}
    finally:
        db.close()


def test_reserved_names_bad_checkpoints_and_existing_directories_are_refused(tmp_path):
    for name in ("__checkpoint", "__meta", "default"):
        with pytest.raises(ValueError, match="reserved"):
            build_task_database(tmp_path / "t", {name: [(b"a", b"1")]}, {})
    with pytest.raises(ValueError, match="non-negative"):
        build_task_database(tmp_path / "t", {}, {("orders", -1): 5})
    (tmp_path / "t").mkdir()
    with pytest.raises(FileExistsError):
        build_task_database(tmp_path / "t", {}, {})


def test_install_refuses_a_target_holding_task_state_unless_forced(tmp_path):
    state = tmp_path / "state"
    (state / "app").mkdir(parents=True)
    (state / "app" / "worker.id").write_text("abc\n")   # app dir exists: per-directory renames
    old = {"counts": [(b"a", b"old")]}
    root = new_build_root(state, "app")
    build_task_database(root / "task-0_3", old, {("orders", 3): 1})
    build_task_database(root / "task-0_9", old, {("orders", 9): 1})
    assert [p.name for p in install_task_databases(root, state, "app")] == ["task-0_3", "task-0_9"]

    new = {"counts": [(b"a", b"new"), (b"b", b"new")]}
    root = new_build_root(state, "app")
    build_task_database(root / "task-0_3", new, {("orders", 3): 2})
    with pytest.raises(ConfigError, match=r"already holds task state \(task-0_3, task-0_9\)"):
        install_task_databases(root, state, "app")
    assert (root / "task-0_3").is_dir()          # nothing moved: the build is still there
    db = RocksDBDatabase(state / "app" / "task-0_3")
    try:
        assert list(db.store("counts").items()) == [(b"a", b"old")]
    finally:
        db.close()

    install_task_databases(root, state, "app", force=True)
    assert sorted(p.name for p in state.iterdir()) == ["app"]            # no root, no trash
    assert sorted(p.name for p in (state / "app").iterdir()) == [".lock", "task-0_3", "worker.id"]
    assert (state / "app" / "worker.id").read_text() == "abc\n"
    db = RocksDBDatabase(state / "app" / "task-0_3")
    try:
        assert list(db.store("counts").items()) == new["counts"]
        assert db.read_checkpoint() == {("orders", 3): 2}
    finally:
        db.close()


def test_install_refuses_while_a_worker_process_holds_the_state_directory(tmp_path):
    state = tmp_path / "state"
    (state / "app").mkdir(parents=True)
    code = ("import sys, time; from processor.runtime.state_lock import StateDirLock; "
            "StateDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(state / "app")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        root = new_build_root(state, "app")
        build_task_database(root / "task-0_0", {"s": [(b"k", b"v")]}, {("orders", 0): 1})
        with pytest.raises(StateDirLocked, match="a worker is running on"):
            install_task_databases(root, state, "app")
        assert (root / "task-0_0").is_dir()
        assert not (state / "app" / "task-0_0").exists()
    finally:
        holder.kill()
        holder.wait()


def test_throughput_one_million_entries(tmp_path, report):
    n = 1_000_000
    value = b"v" * 60
    entries = [(i.to_bytes(8, "big"), value) for i in range(n)]

    t0 = time.perf_counter()
    write_sst(tmp_path / "one.sst", entries)
    write_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    path = build_task_database(tmp_path / "task-0_0", {"s": iter(entries)}, {("orders", 0): n})
    build_s = time.perf_counter() - t0

    db = RocksDBDatabase(path)
    try:
        assert sum(1 for _ in db.store("s").items()) == n
        assert db.store("s").get((n - 1).to_bytes(8, "big")) == value
    finally:
        db.close()
    lines = [f"write_sst: {n} entries (8-byte keys, 60-byte values) in {write_s:.2f} s = "
             f"{n / write_s:,.0f} entries/s",
             f"build_task_database (write + ingest + checkpoint + close): {build_s:.2f} s = "
             f"{n / build_s:,.0f} entries/s"]
    for line in lines:
        print(line)
        report(line)


def test_leftovers_of_a_killed_build_are_never_installed(tmp_path):
    state = tmp_path / "state"
    root = new_build_root(state, "app")
    (root / "task-0_3.partial").mkdir()         # a build killed before its final rename
    (root / "task-0_3.sst-staging").mkdir()
    build_task_database(root / "task-0_4", {"s": [(b"k", b"v")]}, {("orders", 4): 1})
    assert [p.name for p in install_task_databases(root, state, "app")] == ["task-0_4"]
    assert sorted(p.name for p in (state / "app").iterdir()) == [".lock", "task-0_4"]
    assert not root.exists()
