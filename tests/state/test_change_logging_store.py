"""``ChangeLoggingStores`` (``processor/state/change_logging.py``) around a real RocksDB task
database and around memory stores: the changes since the last commit are every key written
through the wrapper, once, in first-write order, with its last writer and its current value;
writes to the inner provider (a restore) are not changes; a commit clears them; an undone write
leaves the changes as before it."""

import pytest

from processor.state.change_logging import ChangeLoggingStores
from processor.state.memory import MemoryStores
from processor.state.rocksdb import RocksDBDatabase


@pytest.fixture(params=["rocksdb", "memory"])
def inner(request, tmp_path):
    db = RocksDBDatabase(tmp_path / "db") if request.param == "rocksdb" else MemoryStores()
    yield db
    db.close()


def test_changes_are_first_write_order_last_writer_current_value(inner):
    stores = ChangeLoggingStores(inner)
    s = stores.store("counts")
    stores.writer = ("in", 0, 1)
    s.put(b"b", b"1")
    stores.writer = ("in", 0, 2)
    s.put(b"a", b"1")
    stores.writer = ("in", 0, 3)
    s.put(b"b", b"2")
    s.delete(b"a")
    stores.writer = ("in", 0, 4)
    s.put_all([(b"c", b"9"), (b"d", None)])
    assert s.changed() == [(b"b", b"2", ("in", 0, 3)), (b"a", None, ("in", 0, 3)),
                           (b"c", b"9", ("in", 0, 4)), (b"d", None, ("in", 0, 4))]
    assert stores.has_changes()
    # reads go to the inner store, pending writes included
    assert s.get(b"b") == b"2" and s.get(b"a") is None
    assert list(s.items()) == [(b"b", b"2"), (b"c", b"9")]


def test_commit_clears_changes_and_commits_the_inner_provider(inner):
    stores = ChangeLoggingStores(inner)
    stores.writer = ("in", 0, 7)
    stores.store("counts").put(b"k", b"v")
    stores.commit({("in", 0): 8})
    assert not stores.has_changes() and stores.store("counts").changed() == []
    assert stores.read_checkpoint() == {("in", 0): 8}
    assert inner.store("counts").get(b"k") == b"v"


def test_writes_to_the_inner_provider_are_not_changes(inner):
    stores = ChangeLoggingStores(inner)
    inner.store("counts").put(b"restored", b"1")   # a restore applying a changelog record
    s = stores.store("counts")
    assert s.get(b"restored") == b"1"
    assert s.changed() == [] and not stores.has_changes()


def test_an_undone_write_leaves_the_changes_as_before(inner):
    stores = ChangeLoggingStores(inner)
    journal: list = []
    stores.journal = journal
    s = stores.store("counts")
    stores.writer = ("in", 0, 1)
    s.put(b"a", b"1")
    journal.clear()                     # offset 1 succeeded
    stores.writer = ("in", 0, 2)
    s.put(b"a", b"2")                   # offset 2 overwrites a and adds b, then fails
    s.put(b"b", b"1")
    for store, key, previous in reversed(journal):
        store.undo(key, previous)
    assert s.changed() == [(b"a", b"1", ("in", 0, 1))]
    assert s.get(b"b") is None and list(s.items()) == [(b"a", b"1")]
