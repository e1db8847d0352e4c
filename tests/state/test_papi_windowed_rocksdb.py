"""Processor API window and session stores on real RocksDB (rocksdict in ``tmp_path``): a task
closed and reopened at commits (its store, its observed stream time and duplicate sequence in
the bookkeeping reopened from disk) gives the output and the column families, byte for byte, of
an uninterrupted run, and that output is the plain-Python model's."""

import json

import pytest

from processor.engine.task import Task
from processor.state.rocksdb import RocksDBDatabase
from tests.support.collectors import RecordLog
from tests.unit import test_papi_session_store as sessions
from tests.unit import test_papi_window_store as windows


def run(topology, ops, path, log, stop=None):
    """Process ``ops`` (key, value object, timestamp) from the task's checkpoint on, committing
    every 7; stop (after a commit) before index ``stop``. Returns every column family's bytes."""
    task = Task(topology, 0, 0, RocksDBDatabase(path), log, lambda: 0, on_error="fail")
    try:
        for i, (k, v, ts) in enumerate(ops):
            if stop is not None and i == stop:
                task.commit()
                return None
            if i < task.positions.get(("in", 0), 0):
                continue
            task.process("in", 0, i, ts, k.encode(), json.dumps(v).encode())
            if i % 7 == 0:
                task.commit()
        task.commit()
        return {name: list(task.stores.store(name).items()) for name in ("w", "s", "_bookkeeping")
                if any(s.name == name for s in task.store_specs) or name == "_bookkeeping"}
    finally:
        task.close()


CASES = {
    "window": lambda: (windows.script_topology(200_000, 50_000, False), windows.script_ops(12)),
    "window-duplicates": lambda: (windows.script_topology(200_000, 50_000, True), windows.script_ops(11)),
    "session": lambda: (sessions.script_topology(150_000), sessions.script_ops(21, 150_000)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_windowed_store_survives_close_and_reopen_and_follows_the_model(tmp_path, case):
    topology, ops = CASES[case]()
    topology = topology.for_application("app")
    clean = RecordLog()
    clean_stores = run(topology, ops, tmp_path / "clean", clean)
    restarted = RecordLog()
    for stop in (101, 333, 334, 590):
        assert run(topology, ops, tmp_path / "restarted", restarted, stop=stop) is None
    stores = run(topology, ops, tmp_path / "restarted", restarted)

    assert restarted.records == clean.records
    assert stores == clean_stores
    name = "s" if case == "session" else "w"
    assert len(stores[name]) >= 10 and len(stores["_bookkeeping"]) == 2   # task stream time, the store's clock

    if case == "session":
        want, _ = sessions.model_outputs(ops, 150_000)
    else:
        want, _ = windows.model_outputs(ops, 200_000, 50_000, case == "window-duplicates")
    got = [(k.decode(), None if v is None else json.loads(v)) for _, k, v, _ in clean.records]
    assert got == [(k, v) for k, v in want]
