"""A stale read of a standby replica (``processor/runtime/interactive_queries.py``) sees the
replica's database as of its last commit: the writes a standby pass keeps pending (part of a
commit unit it has not finished applying) are not seen, by ``get`` nor by a range scan. Real
RocksDB in ``tmp_path``."""

from processor.runtime.interactive_queries import _AsCommitted
from processor.state.rocksdb import RocksDBDatabase


def test_a_stale_read_sees_the_last_commit_not_the_pending_writes(tmp_path):
    db = RocksDBDatabase(tmp_path / "task-0_1")
    try:
        s = db.store("counts")
        s.put(b"a", b"1")
        s.put(b"b", b"2")
        db.commit({("changelog", 1): 2})
        s.put(b"a", b"10")   # a pass under way: applied, not committed
        s.delete(b"b")
        s.put(b"c", b"3")
        assert [s.get(k) for k in (b"a", b"b", b"c")] == [b"10", None, b"3"]
        stale = _AsCommitted(db).store("counts")
        assert [stale.get(k) for k in (b"a", b"b", b"c")] == [b"1", b"2", None]
        assert list(stale.range()) == [(b"a", b"1"), (b"b", b"2")]
        assert list(stale.range(b"b", b"z")) == [(b"b", b"2")]
    finally:
        db.close()
