"""A backfill task's stores between two of its runs: pickled memory stores with a version byte in
front (``STATE_FORMAT``), the bytes a run leaves for the next (``backfill/task_run.py``).
Invariant: a blob of another format is refused (``StateError``), never read as this one."""

from __future__ import annotations

import pickle

STATE_FORMAT = 1   # version byte of a task's stores between runs


def encode_state(stores, offsets) -> bytes:
    return bytes([STATE_FORMAT]) + pickle.dumps(
        {"stores": {n: list(s.items()) for n, s in stores.stores.items()},
         "checkpoint": stores.checkpoint, "offsets": offsets}, protocol=pickle.HIGHEST_PROTOCOL)


def decode_state(blob: bytes | None):
    """``(MemoryStores, virtual offsets of internal partitions)`` from ``encode_state``'s bytes
    (None: a task's first run, empty stores)."""
    from processor.errors import StateError
    from processor.state.memory import MemoryStores

    stores = MemoryStores()
    if blob is None:
        return stores, {}
    if blob[0] != STATE_FORMAT:
        raise StateError(f"backfill: a task's stores between runs are in format {blob[0]}, not {STATE_FORMAT}")
    saved = pickle.loads(blob[1:])
    for name, items in saved["stores"].items():
        stores.store(name).put_all(items)
    stores.checkpoint = dict(saved["checkpoint"])
    return stores, saved["offsets"]
