"""State: the KeyValueStore protocol, RocksDB and memory stores, and the byte codecs.

The RocksDB store is imported on first use only (``processor.state.RocksDBDatabase`` or
``processor.state.rocksdb``), so the engine, the operators and the test driver, which import
codecs from this package, never load rocksdict."""

from processor.state.memory import MemoryStore, MemoryStores
from processor.state.store import KeyValueStore

__all__ = ["KeyValueStore", "MemoryStore", "MemoryStores", "RocksDBDatabase", "RocksDBStore"]


def __getattr__(name):
    if name in ("RocksDBDatabase", "RocksDBStore"):
        from processor.state import rocksdb

        return getattr(rocksdb, name)
    raise AttributeError(f"module 'processor.state' has no attribute {name!r}")
