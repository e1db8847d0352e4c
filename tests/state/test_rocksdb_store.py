"""RocksDBStore / RocksDBDatabase on real rocksdict databases in tmp_path."""

import pytest

from processor.errors import StateError
from processor.state import MemoryStore, RocksDBDatabase, combined_key, timestamped


def test_reads_see_pending_writes_and_commit_is_atomic_with_offsets(tmp_path):
    db = RocksDBDatabase(tmp_path / "task")
    s = db.store("s")
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    assert s.get(b"a") == b"1"
    db.commit({("topic", 3): 42})
    s.put(b"c", b"3")
    s.delete(b"a")
    assert [k for k, _ in s.items()] == [b"b", b"c"]
    db.close()  # c and the delete of a were never committed: a crash loses them with their offsets

    db = RocksDBDatabase(tmp_path / "task")
    assert db.read_checkpoint() == {("topic", 3): 42}
    assert list(db.store("s").items()) == [(b"a", b"1"), (b"b", b"2")]
    assert set(db.column_families()) == {"default", "__meta", "__checkpoint", "s"}
    db.close()


def test_reopen_keeps_every_column_family(tmp_path):
    db = RocksDBDatabase(tmp_path / "t")
    for name in ("one", "two", "three"):
        db.store(name).put(name.encode(), b"x")
    db.commit({})
    db.close()
    db = RocksDBDatabase(tmp_path / "t")
    assert {n: db.store(n).get(n.encode()) for n in ("one", "two", "three")} == \
        {"one": b"x", "two": b"x", "three": b"x"}
    db.close()


def test_range_and_prefix_merge_pending_writes_in_byte_order(tmp_path):
    db = RocksDBDatabase(tmp_path / "t")
    s = db.store("s")
    for k in (b"a", b"ab", b"abc", b"b", b"\xff"):
        s.put(k, k)
    db.commit({})
    s.put(b"aa", b"new")       # pending insert inside the range
    s.delete(b"abc")           # pending delete of a committed key
    s.put(b"ab", b"changed")   # pending overwrite
    assert list(s.prefix(b"a")) == [(b"a", b"a"), (b"aa", b"new"), (b"ab", b"changed")]
    assert list(s.range(b"aa", b"b")) == [(b"aa", b"new"), (b"ab", b"changed")]
    assert [k for k, _ in s.range(b"b")] == [b"b", b"\xff"]
    assert list(s.prefix(b"\xff")) == [(b"\xff", b"\xff")]
    db.close()


def test_unknown_format_version_is_rejected_loudly(tmp_path):
    db = RocksDBDatabase(tmp_path / "t")
    db._cf("__meta").put(b"format_version", b"\x09")
    db.close()
    with pytest.raises(StateError, match="format version 9"):
        RocksDBDatabase(tmp_path / "t")


def test_combined_key_prefix_scan_cannot_match_a_longer_foreign_key(tmp_path):
    db = RocksDBDatabase(tmp_path / "t")
    rocks = db.store("subs")
    mem = MemoryStore("subs")
    for fk, pk in [(b"ab", b"p1"), (b"ab", b"p2"), (b"abc", b"p1"), (b"a", b"bp1"), (b"b", b"p0")]:
        for s in (rocks, mem):
            s.put(combined_key.encode(fk, pk), b"")
    for s in (rocks, mem):
        found = [combined_key.decode(k) for k, _ in s.prefix(combined_key.prefix(b"ab"))]
        assert found == [(b"ab", b"p1"), (b"ab", b"p2")]
        assert [combined_key.decode(k) for k, _ in s.prefix(combined_key.prefix(b"a"))] == [(b"a", b"bp1")]
    assert combined_key.encode(b"ab", b"p1") == b"\x00\x00\x00\x02abp1"
    with pytest.raises(ValueError):
        combined_key.decode(b"\x00\x00\x00\x09ab")
    db.close()


def test_timestamped_value_layout():
    v = timestamped.encode(1_700_000_000_123, b"payload")
    assert v == (1_700_000_000_123).to_bytes(8, "big") + b"payload"
    assert timestamped.decode(v) == (1_700_000_000_123, b"payload")
    assert timestamped.decode(timestamped.encode(-5, b"")) == (-5, b"")


@pytest.mark.parametrize("churn", [False, True], ids=["writes-and-scans", "with-commits-and-undone-writes"])
def test_memory_store_matches_rocksdb_order_under_interleaved_writes_and_scans(tmp_path, churn):
    """Differential: the memory store (lazy sorted index) and RocksDB agree on every read; with
    ``churn``, also across commits (which empty RocksDB's pending writes and their sorted index)
    and writes undone through the journal (a failed record), newest first."""
    import random

    rng = random.Random(11 if churn else 7)
    db = RocksDBDatabase(tmp_path / "t")
    rocks, mem = db.store("s"), MemoryStore("s")
    if churn:
        rocks.journal, mem.journal = [], []
    keys = [bytes([rng.randrange(256) for _ in range(rng.randrange(0, 4))]) for _ in range(60)]
    scans = 0
    for step in range(4000):
        op = rng.random()
        k = rng.choice(keys)
        if op < 0.45:
            v = str(step).encode()
            rocks.put(k, v)
            mem.put(k, v)
        elif op < 0.6:
            rocks.delete(k)
            mem.delete(k)
        elif op < 0.65:
            batch = [(rng.choice(keys), rng.choice([None, b"b%d" % step])) for _ in range(5)]
            rocks.put_all(batch)
            mem.put_all(batch)
        elif op < 0.7:
            assert mem.get(k) == rocks.get(k)
        elif op < 0.78 and churn:   # a failed record: its writes undone, newest first
            n = rng.randrange(len(rocks.journal) + 1)
            for journal in (rocks.journal, mem.journal):
                for store, key, previous in reversed(journal[len(journal) - n:]):
                    store.undo(key, previous)
                del journal[len(journal) - n:]
        elif op < 0.82 and churn:
            db.commit({})
            assert rocks.pending == {}
            rocks.journal.clear()
            mem.journal.clear()
        else:
            lo, hi = sorted(rng.sample(keys, 2))
            assert list(mem.range(lo, hi)) == list(rocks.range(lo, hi)), step
            assert list(mem.prefix(k[:1])) == list(rocks.prefix(k[:1])), step
            scans += 1
    assert scans > 500
    assert list(mem.items()) == list(rocks.items())
    assert len(mem) == len(list(rocks.items()))
    db.commit({})
    assert list(mem.items()) == list(rocks.items())
    db.close()
