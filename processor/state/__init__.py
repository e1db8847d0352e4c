"""State: the KeyValueStore protocol, RocksDB and memory stores, and the byte codecs."""

from processor.state.memory import MemoryStore, MemoryStores
from processor.state.rocksdb import RocksDBDatabase, RocksDBStore
from processor.state.store import KeyValueStore

__all__ = ["KeyValueStore", "MemoryStore", "MemoryStores", "RocksDBDatabase", "RocksDBStore"]
