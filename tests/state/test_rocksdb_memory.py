"""RocksDB memory settings (``configure_memory``; ``processor run --state-block-cache-mb /
--state-write-buffer-mb``) reach the databases opened afterwards: a small write buffer flushes
a column family to SST files where RocksDB's default (64 MB) keeps the same writes in memory."""

import time

import pytest

from processor.errors import ConfigError
from processor.state import rocksdb
from processor.state.rocksdb import RocksDBDatabase, configure_memory


@pytest.fixture(autouse=True)
def _defaults_after():
    yield
    configure_memory()


def _write_and_count_sst(path, mb: int) -> int:
    db = RocksDBDatabase(path)
    try:
        store = db.store("big")
        value = b"x" * 1000
        for i in range(mb * 1000):
            store.put(b"k%08d" % i, value)
            if i % 2000 == 1999:
                db.commit({("in", 0): i})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:     # memtable flushes run in the background
            n = len(list(path.glob("*.sst")))
            if n:
                return n
            time.sleep(0.1)
        return 0
    finally:
        db.close()


def test_a_small_write_buffer_reaches_the_databases(tmp_path):
    configure_memory(block_cache_mb=8, write_buffer_mb=1)
    assert rocksdb._memory == {"block_cache_mb": 8, "write_buffer_mb": 1}
    assert _write_and_count_sst(tmp_path / "small", 6) > 0
    configure_memory()
    assert rocksdb._memory == {"block_cache_mb": 128, "write_buffer_mb": None}
    db = RocksDBDatabase(tmp_path / "default")
    try:
        store = db.store("big")
        for i in range(6000):
            store.put(b"k%08d" % i, b"x" * 1000)
        db.commit({("in", 0): 6000})
        time.sleep(0.5)
        assert list((tmp_path / "default").glob("*.sst")) == []   # 6 MB stay in the 64 MB memtable
    finally:
        db.close()


def test_sizes_below_one_mb_are_refused():
    with pytest.raises(ConfigError, match="--state-write-buffer-mb"):
        configure_memory(write_buffer_mb=0)
    with pytest.raises(ConfigError, match="--state-block-cache-mb"):
        configure_memory(block_cache_mb=-5)
