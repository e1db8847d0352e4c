"""A failed record's writes undone on a real RocksDB task database, seen as the worker's task
sees it: ``ChangeLoggingStores`` around a ``RocksDBDatabase`` (``undo`` of both).

The journal must put back what the record overwrote among the writes still pending since the
last commit (the pending value, and the change entry with the writer that the changelog header
names), and drop what it added; the
database committed afterwards equals the one a history without the failed records commits.
"""

from processor import StreamsBuilder
from processor.engine.task import Task
from processor.state.change_logging import ChangeLoggingStores
from processor.state.rocksdb import RocksDBDatabase
from tests.support.collectors import RecordLog


def topology():
    b = StreamsBuilder()
    items = b.table("items", store_name="items")

    def positive(k, v):
        if v["n"] % 7 == 0:
            raise ValueError("multiple of 7")
        return v["n"] > 0

    # the count runs first: a failing record has written the items store and the count's
    # stores (and its stream time) before the filter raises
    items.to_stream().group_by_key().count(name="updates").to_stream().to("updates-out")
    items.filter(positive).to_stream().to("out")
    return b.build().for_application("app")


HISTORY = [("a", 1), ("b", 2), ("a", 7), ("c", 3), ("b", 14), ("b", 5), ("a", 4), ("d", 21), ("c", 6)]


def contract(path):
    """Every contract column family (not ``__``-prefixed) as committed."""
    db = RocksDBDatabase(path)
    try:
        return {cf: list(db.store(cf).items()) for cf in db.column_families()
                if not cf.startswith("__") and cf != "default"}
    finally:
        db.close()


def run(path, history, on_error, commit_every):
    topo = topology()
    db = ChangeLoggingStores(RocksDBDatabase(path))
    collector = RecordLog()
    task = Task(topo, 0, 0, db, collector, lambda: 0, on_error=on_error, dlq_topic="app-dlq")
    seen = []
    for offset, (key, n) in history:
        task.process("items", 0, offset, offset, f'"{key}"'.encode(), f'{{"n": {n}}}'.encode())
        if (offset + 1) % commit_every == 0:
            task.commit()
        seen.append({name: (dict(s.inner.pending), dict(s.changes)) for name, s in db.stores.items()})
    task.commit()
    task.close()
    return collector.records, seen


def test_undo_restores_pending_writes_and_their_writers(tmp_path):
    history = list(enumerate(HISTORY))
    records, seen = run(tmp_path / "dlq", history, "dlq", commit_every=100)   # all pending
    # a=7 (offset 2) overwrote the pending a=1 in the items and count stores, then failed
    assert seen[2] == seen[1]
    # b=14 (offset 4) likewise over b=2: pending values and writers as after offset 3
    assert seen[4] == seen[3]
    assert seen[4]["items"][1] == {b'"a"': ("items", 0, 0), b'"b"': ("items", 0, 1), b'"c"': ("items", 0, 3)}
    assert seen[5]["items"][1][b'"b"'] == ("items", 0, 5)
    assert len(seen[5]["updates"][0]) == 3
    dlq = [r for r in records if r[0] == "app-dlq"]
    assert [(r[1], r[3]) for r in dlq] == [(b'"a"', 2), (b'"b"', 4), (b'"d"', 7)]


def test_committed_database_equals_a_history_without_the_failed_records(tmp_path):
    history = list(enumerate(HISTORY))
    clean = [(o, (k, n)) for o, (k, n) in history if n % 7 != 0]
    for commit_every in (1, 3, 100):
        got, _ = run(tmp_path / f"dlq{commit_every}", history, "dlq", commit_every)
        want, _ = run(tmp_path / f"clean{commit_every}", clean, "fail", commit_every)
        assert [r for r in got if r[0] != "app-dlq"] == want
        assert contract(tmp_path / f"dlq{commit_every}") == contract(tmp_path / f"clean{commit_every}")
        skipped, _ = run(tmp_path / f"skip{commit_every}", history, "skip", commit_every)
        assert skipped == want
        assert contract(tmp_path / f"skip{commit_every}") == contract(tmp_path / f"clean{commit_every}")
