"""RocksDB state: one database per task, one column family per store (rocksdict, raw bytes).

Invariant: what is on disk is always the state as of one commit, together with the input
offsets of that commit. Writes between commits stay in each store's pending map (visible to
reads at once); ``RocksDBDatabase.commit(offsets)`` writes every store's pending writes and the
offsets into the ``__checkpoint`` column family as ONE atomic WriteBatch. A crash therefore
leaves state and offsets consistent, and a replayed record meets the state as of the last commit.

Column families:
  ``__meta``        ``format_version`` -> 1 byte (rejected loudly if unknown)
  ``__checkpoint``  ``{topic}\\x00{partition}`` -> 8-byte BE offset: for an input partition the
                    next offset to process; for a changelog partition the end offset (the offset
                    after the last changelog record) this database reflects
  ``<store>``       one per store, values in the timestamped layout (state/timestamped.py)

The directory also holds ``task-owner.json``, which names the application and sub-topology that
wrote it (``processor/state/task_owner.py``, checked before a worker opens a task's database).

Databases are opened with a bloom filter and a shared block cache, and reopened with all of
their existing column families.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict

import rocksdict
from sortedcontainers import SortedList

from processor.errors import ConfigError, StateDirUnusable, StateError
from processor.state.store import merge_sorted, prefix_upper_bound

# 2: operator bookkeeping (stream times, high-water marks, outbox counter) moved from ``__task``
# to the ``_bookkeeping`` column family; a version-1 database is refused (its bookkeeping would be
# missed): delete it and the application's changelog topics, or backfill, to rebuild.
FORMAT_VERSION = 2
_META = "__meta"
_CHECKPOINT = "__checkpoint"
_OFFSET = struct.Struct(">q")
_MISSING = object()

_block_cache = None
DEFAULT_BLOCK_CACHE_MB = 128


class _Memory(TypedDict):
    block_cache_mb: int
    write_buffer_mb: int | None


_memory: _Memory = {"block_cache_mb": DEFAULT_BLOCK_CACHE_MB, "write_buffer_mb": None}


def configure_memory(block_cache_mb: int | None = None, write_buffer_mb: int | None = None) -> None:
    """Memory of the databases this process opens from now on: the block cache all of them share
    (MB; None: 128) and each column family's write buffer (memtable, MB; None: RocksDB's 64 MB,
    of which up to two per column family exist at once). ``processor run --state-block-cache-mb
    / --state-write-buffer-mb``; ``benchmarks/memory.py`` measures a worker's RSS with the defaults."""
    global _block_cache
    for name, v in (("--state-block-cache-mb", block_cache_mb), ("--state-write-buffer-mb", write_buffer_mb)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be at least 1 (MB), not {v}")
    cache_mb = DEFAULT_BLOCK_CACHE_MB if block_cache_mb is None else block_cache_mb
    if cache_mb != _memory["block_cache_mb"]:
        _block_cache = None
    _memory["block_cache_mb"] = cache_mb
    _memory["write_buffer_mb"] = write_buffer_mb


def _options() -> rocksdict.Options:
    global _block_cache
    if _block_cache is None:
        _block_cache = rocksdict.Cache(_memory["block_cache_mb"] << 20)
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    if _memory["write_buffer_mb"] is not None:
        opts.set_write_buffer_size(_memory["write_buffer_mb"] << 20)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(_block_cache)
    table.set_cache_index_and_filter_blocks(True)
    opts.set_block_based_table_factory(table)
    return opts


# RocksDB's texts of a directory no retry mends (its IOError carries strerror)
_UNUSABLE_DIRECTORY = ("No space left on device", "Read-only file system", "Permission denied",
                       "Disk quota exceeded")


def state_error(what: str, exc: BaseException) -> StateError:
    """``what`` failed with RocksDB's ``exc``: a full, read-only or unwritable directory is
    ``StateDirUnusable`` (exit 4, one line), anything else ``StateError``."""
    text = str(exc)
    if any(marker in text for marker in _UNUSABLE_DIRECTORY):
        return StateDirUnusable(f"{what}: the state directory cannot be used: {text}")
    return StateError(f"{what}: {text}")


class RocksDBStore:
    """One store: a column family plus the writes pending since the last commit (the task's
    write buffer: reads see them at once; the commit writes them to RocksDB). The changelog
    side is not this class's concern: the worker wraps the database in
    ``processor/state/change_logging.py``. ``journal`` (None, or a list the task owns) receives
    ``(store, key, previous pending entry)`` before each write, so the writes of one record
    can be undone."""

    def __init__(self, name: str, cf):
        self.name = name
        self.journal: list | None = None
        self._cf = cf
        self.pending: dict[bytes, bytes | None] = {}
        # the pending keys in byte order, built on the first ordered read since the last commit
        # and kept up to date from then on (a prefix or range scan then costs O(log n) in the
        # pending writes, not a sort of all of them: a foreign-key responder's or a window
        # store's scan per record, with a commit interval's writes pending)
        self._sorted: SortedList | None = None

    def get(self, key):
        v = self.pending.get(key, _MISSING)
        if v is _MISSING:
            return self._cf.get(key)
        return v

    def put(self, key, value):
        if self.journal is not None:
            self.journal.append((self, key, self.pending.get(key, _MISSING)))
        if self._sorted is not None and key not in self.pending:
            self._sorted.add(key)
        self.pending[key] = value

    def delete(self, key):
        if self.journal is not None:
            self.journal.append((self, key, self.pending.get(key, _MISSING)))
        if self._sorted is not None and key not in self.pending:
            self._sorted.add(key)
        self.pending[key] = None

    def put_all(self, entries):
        journal = self.journal
        pending = self.pending
        ordered = self._sorted
        for k, v in entries:
            if journal is not None:
                journal.append((self, k, pending.get(k, _MISSING)))
            if ordered is not None and k not in pending:
                ordered.add(k)
            pending[k] = v

    def undo(self, key, pending) -> None:
        """Put ``key`` back as a journal entry found it (``processor/engine/task.py``: a record
        that fails under ``on_error`` dlq/skip leaves no write behind)."""
        if pending is _MISSING:
            if self.pending.pop(key, _MISSING) is not _MISSING and self._sorted is not None:
                self._sorted.remove(key)
        else:
            if self._sorted is not None and key not in self.pending:
                self._sorted.add(key)
            self.pending[key] = pending

    def clear_pending(self) -> None:
        """The pending writes are in the column family now (``RocksDBDatabase.commit``)."""
        self.pending.clear()
        self._sorted = None

    def committed(self, key):
        """The value as of the last commit (pending writes ignored)."""
        return self._cf.get(key)

    def range(self, lo=None, hi=None):
        pending = self.pending
        if not pending:
            return self._base_range(lo, hi)
        if self._sorted is None:
            self._sorted = SortedList(pending)
        overlay = [(k, pending[k]) for k in self._sorted.irange(lo, hi, inclusive=(True, False))]
        if not overlay:
            return self._base_range(lo, hi)
        return merge_sorted(self._base_range(lo, hi), overlay)

    def committed_range(self, lo=None, hi=None):
        """``range`` as of the last commit (pending writes ignored)."""
        return self._base_range(lo, hi)

    def _base_range(self, lo, hi):
        ro = rocksdict.ReadOptions()
        if hi is not None:
            ro.set_iterate_upper_bound(hi)
        it = self._cf.iter(ro)
        if lo is None:
            it.seek_to_first()
        else:
            it.seek(lo)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def prefix(self, prefix):
        return self.range(prefix, prefix_upper_bound(prefix))

    def items(self):
        return self.range()


class RocksDBDatabase:
    """The database of one task. Use ``store(name)``, ``commit(offsets)``, ``close()``."""

    def __init__(self, path: str | Path, column_families: Iterable[str] = ()):
        """Open (or create) the database at ``path``; ``column_families`` names column families
        to create at open when missing (one manifest write for all of them instead of one each:
        the backfill knows every store of a task up front)."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._opts = _options()
        try:
            existing = rocksdict.Rdict.list_cf(str(self.path)) if (self.path / "CURRENT").exists() else []
            cfs = {name: self._opts for name in [*existing, *column_families] if name != "default"}
            self._db = rocksdict.Rdict(str(self.path), self._opts, column_families=cfs)
        except Exception as exc:
            raise state_error(f"cannot open state database {self.path}", exc) from exc
        self._cfs: dict[str, rocksdict.Rdict] = {}   # column family handles
        self.stores: dict[str, RocksDBStore] = {}
        self.journal: list | None = None   # given to every store opened (see RocksDBStore)
        meta = self._cf(_META)
        version = meta.get(b"format_version")
        if version is None:
            meta.put(b"format_version", bytes([FORMAT_VERSION]))
        elif version != bytes([FORMAT_VERSION]):
            self.close()
            hint = ("its operator bookkeeping lives in __task, where this build no longer reads it: reset "
                    "the application (state directories, changelog topics, group offsets) or backfill it"
                    if version == b"\x01" else "delete the directory to rebuild it from the changelog")
            raise StateError(
                f"state database {self.path} has format version {version[0]}, this build reads "
                f"version {FORMAT_VERSION}; {hint}"
            )

    def _cf(self, name: str):
        cf = self._cfs.get(name)
        if cf is None:
            try:
                cf = self._db.get_column_family(name)
            except Exception:
                try:
                    cf = self._db.create_column_family(name, self._opts)
                except Exception as exc:
                    raise state_error(f"cannot create column family {name} in state database {self.path}",
                                      exc) from exc
            self._cfs[name] = cf
        return cf

    def column_families(self) -> list[str]:
        return rocksdict.Rdict.list_cf(str(self.path))

    def store(self, name: str) -> RocksDBStore:
        s = self.stores.get(name)
        if s is None:
            cf = self._cf(name)
            s = RocksDBStore(name, cf)
            s.journal = self.journal
            self.stores[name] = s
        return s

    def read_checkpoint(self) -> dict[tuple[str, int], int]:
        out = {}
        for k, v in self._cf(_CHECKPOINT).items():
            topic, _, part = k.decode("utf-8").rpartition("\x00")
            out[(topic, int(part))] = _OFFSET.unpack(v)[0]
        return out

    def commit(self, offsets: dict[tuple[str, int], int]) -> None:
        """Atomically persist every store's pending writes and the next offsets to process."""
        wb = rocksdict.WriteBatch(raw_mode=True)
        n = 0
        for s in self.stores.values():
            if s.pending:
                h = self._db.get_column_family_handle(s.name)
                for k, v in s.pending.items():
                    if v is None:
                        wb.delete(k, h)
                    else:
                        wb.put(k, v, h)
                n += len(s.pending)
        if offsets:
            self._cf(_CHECKPOINT)
            h = self._db.get_column_family_handle(_CHECKPOINT)
            for (topic, part), off in offsets.items():
                wb.put(f"{topic}\x00{part}".encode(), _OFFSET.pack(off), h)
                n += 1
        if n:
            try:
                self._db.write(wb)
            except Exception as exc:
                raise state_error(f"cannot write state database {self.path}", exc) from exc
        for s in self.stores.values():
            s.clear_pending()

    def close(self) -> None:
        for cf in self._cfs.values():
            cf.close()
        self._cfs.clear()
        self.stores.clear()
        self._db.close()

    @staticmethod
    def destroy(path: str | Path) -> None:
        rocksdict.Rdict.destroy(str(path))
