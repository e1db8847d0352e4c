"""Writing stores: a task's RocksDB database in the worker's layout, built from sorted entries
through SST files, and moved into the state directory at the very end (DESIGN "Backfill" step 5).

Invariant: a ``task-<sub>_<partition>`` directory under ``<state-dir>/<application-id>/`` is, at
every instant, either absent, the one that was there before, or a complete backfilled database
(every column family ingested, the format-version marker and the local checkpoint written, every
handle closed). Never a half-built one, whatever is killed when:

- ``build_task_database`` builds in ``<dir>.partial`` and renames it to ``<dir>`` only once the
  database is complete and closed; a failure removes what it built;
- ``install_task_databases`` takes the state directory's lock (no worker can be running on it),
  and moves each finished task directory in with one ``rename`` (or, when the application's
  directory does not exist yet, the whole build root at once), from a build root on the same
  filesystem (``new_build_root``: ``<state-dir>/<application-id>.backfill-tmp-<uuid>/``).

The database is the one ``RocksDBDatabase`` (``processor/state/rocksdb.py``) opens: the build
goes through that class itself, so it gets the same options, the ``__meta`` format-version
marker, the ``__checkpoint`` encoding (``commit(offsets)``; read back with ``read_checkpoint()``
and compared) and the ``__task`` column family every worker task has. Store column families are
filled by ingesting one SST file each: written with ``rocksdict.SstFileWriter`` under the
worker's own options (``raw_mode=True``, or ingest fails on the comparator name; and the same
block-based table options, or the ingested files carry no bloom filter), keys strictly ascending
in RocksDB's bytewise order (= Python's ``bytes`` order = Spark's binary order), ingested with
``move_files`` into the bottom level of an empty column family.

What goes into the checkpoint is the caller's: the next input offset per source partition at
the snapshot, and for each changelog partition the end offset the backfill wrote it to (without
those a worker restores every changelog from offset 0 over the built state: correct, but slow).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import rocksdict

from processor.engine.task_id import TaskId
from processor.errors import ConfigError, StateDirLocked, StateError
from processor.runtime.state_lock import StateDirLock
from processor.state.rocksdb import RocksDBDatabase, _options
from processor.state.store import TASK_STORE

# Column families the database itself owns (written through RocksDBDatabase, never ingested).
RESERVED_COLUMN_FAMILIES = frozenset({"default", "__meta", "__checkpoint"})
BUILD_ROOT_SUFFIX = ".backfill-tmp-"
_PARTIAL = ".partial"
_STAGING = ".sst-staging"

Entries = Iterable[tuple[bytes, bytes]]


def new_build_root(state_dir: str | os.PathLike, application_id: str) -> Path:
    """A fresh build root beside the application's state directory (same filesystem, so the
    install is a rename): ``<state-dir>/<application-id>.backfill-tmp-<uuid>/``."""
    root = Path(state_dir) / f"{application_id}{BUILD_ROOT_SUFFIX}{uuid.uuid4().hex}"
    root.mkdir(parents=True)
    return root


def write_sst(path: str | os.PathLike, entries: Entries) -> Path | None:
    """Write ``(key, value)`` pairs, keys strictly ascending in bytewise order, to one SST file
    at ``path``. Returns the path, or None (and writes nothing) when ``entries`` is empty.
    Raises ValueError naming both keys when a key is not greater than the one before it (the
    partial file is removed)."""
    it = iter(entries)
    first = next(it, None)
    if first is None:
        return None
    path = Path(path)
    prev, value = first
    if not isinstance(prev, bytes):
        raise TypeError(f"SST keys must be bytes, not {type(prev).__name__} ({prev!r})")
    writer = rocksdict.SstFileWriter(_options())
    writer.open(str(path))
    done = False
    try:
        writer[prev] = value
        n = 1
        for key, value in it:
            if not key > prev:
                what = "repeats" if key == prev else "sorts before"
                raise ValueError(
                    f"SST {path}: keys must be strictly ascending in bytewise order, but entry {n} "
                    f"key {key!r} {what} the previous key {prev!r}")
            writer[key] = value
            prev = key
            n += 1
        writer.finish()
        done = True
    finally:
        if not done:
            del writer
            path.unlink(missing_ok=True)
    return path


def build_task_database(tmp_dir: str | os.PathLike, column_families: Mapping[str, Entries],
                        checkpoint: Mapping[tuple[str, int], int]) -> Path:
    """Build the database of one task at ``tmp_dir`` (normally ``<build root>/task-<sub>_<p>``,
    which must not exist yet): one column family per entry of ``column_families`` (store name ->
    sorted ``(key, value)`` pairs; ``__task`` included, created empty when absent, as every
    worker task has it), the format-version marker, and ``checkpoint`` ((topic, partition) ->
    offset) as the local checkpoint. Returns ``tmp_dir`` once the database is complete and
    closed; on any error nothing is left at ``tmp_dir``."""
    final = Path(tmp_dir)
    for name in column_families:
        if not isinstance(name, str) or not name:
            raise ValueError(f"column family names must be non-empty strings, not {name!r}")
        if name in RESERVED_COLUMN_FAMILIES:
            raise ValueError(f"column family {name!r} belongs to the database itself (reserved: "
                             f"{sorted(RESERVED_COLUMN_FAMILIES)}); pass the checkpoint separately")
    for tp, off in checkpoint.items():
        if (not isinstance(tp, tuple) or len(tp) != 2 or not isinstance(tp[0], str) or not tp[0]
                or not isinstance(tp[1], int) or tp[1] < 0 or not isinstance(off, int) or off < 0):
            raise ValueError(f"checkpoint entries are (topic, partition) -> offset with a "
                             f"non-negative partition and offset, not {tp!r} -> {off!r}")
    if final.exists():
        raise FileExistsError(f"{final} already exists; build each task database once, in a "
                              f"fresh build root (new_build_root)")
    partial = final.with_name(final.name + _PARTIAL)
    staging = final.with_name(final.name + _STAGING)
    for leftover in (partial, staging):   # a build of this task killed earlier
        if leftover.exists():
            shutil.rmtree(leftover)
    staging.mkdir(parents=True)
    try:
        ssts = {}
        for i, (name, entries) in enumerate(column_families.items()):
            ssts[name] = write_sst(staging / f"{i}.sst", entries)
        # options, __meta format_version: as the worker opens it; every column family at once
        db = RocksDBDatabase(partial, column_families=[TASK_STORE, *column_families,
                                                       *RESERVED_COLUMN_FAMILIES])
        try:
            ingest = rocksdict.IngestExternalFileOptions()
            ingest.set_move_files(True)
            for name in dict.fromkeys([TASK_STORE, *column_families]):
                cf = db._cf(name)          # the handle the worker's store of this name uses
                sst = ssts.get(name)
                if sst is not None:
                    try:
                        cf.ingest_external_file([str(sst)], ingest)
                    except Exception as exc:
                        raise StateError(f"cannot ingest {sst} into column family {name!r} of "
                                         f"{partial}: {exc}") from exc
            wanted = dict(checkpoint)
            db.commit(wanted)
            written = db.read_checkpoint()    # also creates __checkpoint when there are no offsets
            if written != wanted:
                raise StateError(f"checkpoint of {partial} reads back as {written}, not {wanted}")
        finally:
            db.close()                     # column-family handles first, then the database
        partial.rename(final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _task_dirs(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.is_dir() and TaskId.of_dirname(p.name) is not None)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_task_databases(tmp_root: str | os.PathLike, state_dir: str | os.PathLike,
                           application_id: str, *, force: bool = False) -> list[Path]:
    """Move every built ``task-<sub>_<partition>`` directory of ``tmp_root`` into
    ``<state_dir>/<application_id>/`` and remove ``tmp_root``. Returns the installed paths.

    Refuses (ConfigError) when the target already holds task directories, unless ``force``:
    then every existing task directory is moved aside (and deleted once the new ones are in).
    Raises StateDirLocked when a worker is running on the target. ``tmp_root`` must be on the
    target's filesystem (``new_build_root`` makes one there)."""
    tmp_root = Path(tmp_root)
    state_dir = Path(state_dir)
    target = state_dir / application_id
    built = _task_dirs(tmp_root)
    if not built:
        raise ConfigError(f"backfill install: {tmp_root} holds no built task directory "
                          f"(task-<sub>_<partition>); nothing to install into {target}")
    state_dir.mkdir(parents=True, exist_ok=True)
    if os.stat(tmp_root).st_dev != os.stat(state_dir).st_dev:
        raise ConfigError(f"backfill install: build root {tmp_root} is not on the filesystem of "
                          f"{state_dir}; build under the state directory (new_build_root) so "
                          f"that installing is a rename")
    names = [p.name for p in built]
    # Fresh application directory: the whole build root in one rename (all tasks or none).
    if not target.exists() and sorted(p.name for p in tmp_root.iterdir()) == names:
        try:
            os.rename(tmp_root, target)
        except OSError:
            pass                           # a worker created it meanwhile: one by one, locked
        else:
            _fsync_dir(state_dir)
            return [target / n for n in names]
    trash = None
    lock = StateDirLock(target)
    try:
        lock.acquire()
    except StateDirLocked as exc:
        raise StateDirLocked(f"backfill install: a worker is running on {target} ({exc}); stop "
                             f"it before installing backfilled state") from exc
    try:
        existing = _task_dirs(target)
        if existing and not force:
            raise ConfigError(
                f"backfill install: {target} already holds task state "
                f"({', '.join(p.name for p in existing)}); refusing to overwrite it. Delete those "
                f"directories (and reset the application) or install with force=True")
        if existing:
            trash = state_dir / f"{application_id}.backfill-old-{uuid.uuid4().hex}"
            trash.mkdir()
            for p in existing:
                os.rename(p, trash / p.name)
        for p in built:
            os.rename(p, target / p.name)
        _fsync_dir(target)
    finally:
        lock.release()
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(tmp_root, ignore_errors=True)
    return [target / n for n in names]
