"""Key codecs of the stream-stream join stores (contracts; ``processor/operators/stream_join.py``).

Window store (``<join>-this-store``, ``<join>-other-store``; one side's records)::

    {4-byte BE key length}{key bytes}{8-byte BE timestamp (ms, >= 0)}{4-byte BE sequence}

Key first, so the records of one key within a time interval are ONE range scan
(``time_range``); the length prefix keeps key ``ab`` from ever matching a scan for ``a`` or
``abc``. The sequence is a per-store arrival counter (modulo 2**32) so duplicates of
``(key, timestamp)`` are all kept, in arrival order.

Outer store (``<join>-outer-store``; records of a left/outer join still without a match)::

    {8-byte BE timestamp (ms, >= 0)}{1 side byte: 0 left, 1 right}{4-byte BE sequence}{key bytes}

Time first, so the records whose window has closed are one range scan from the beginning
(``outer_before``). The sequence is the record's sequence in its own side's window store, so a
window store key maps to its outer store key (``outer_of``).

Values of both stores are in the timestamped layout (``processor/state/timestamped.py``):
``{8-byte BE timestamp}{value serde bytes}``. Timestamps are never negative (as Kafka, which
rejects records with negative timestamps): big-endian order is then time order.
"""

from __future__ import annotations

import struct

from processor.state.store import prefix_upper_bound

_LEN = struct.Struct(">I")
_TS = struct.Struct(">q")
_TAIL = struct.Struct(">qI")          # timestamp, sequence
_OUTER_HEAD = struct.Struct(">qBI")   # timestamp, side, sequence
MAX_TS = (1 << 63) - 1
SEQ_MODULUS = 1 << 32
LEFT, RIGHT = 0, 1


def _check_ts(ts: int) -> None:
    if not 0 <= ts <= MAX_TS:
        raise ValueError(f"join store timestamps must be in [0, 2**63), not {ts}")


def key_prefix(kb: bytes) -> bytes:
    return _LEN.pack(len(kb)) + kb


def encode(kb: bytes, ts: int, seq: int) -> bytes:
    _check_ts(ts)
    return key_prefix(kb) + _TAIL.pack(ts, seq % SEQ_MODULUS)


def decode(data: bytes) -> tuple[bytes, int, int]:
    """``(key bytes, timestamp, sequence)``."""
    if len(data) < 16:
        raise ValueError(f"join window store key too short ({len(data)} bytes)")
    n = _LEN.unpack_from(data)[0]
    if len(data) != 4 + n + 12:
        raise ValueError(f"join window store key of {len(data)} bytes does not match key length {n}")
    ts, seq = _TAIL.unpack_from(data, 4 + n)
    return data[4:4 + n], ts, seq


def time_range(kb: bytes, lo_ts: int, hi_ts: int) -> tuple[bytes, bytes | None]:
    """Half-open store bounds ``[lo, hi)`` of key ``kb``'s records with ``lo_ts <= ts <= hi_ts``
    (``lo_ts`` is clamped to 0)."""
    p = key_prefix(kb)
    lo = p + _TS.pack(min(max(lo_ts, 0), MAX_TS))
    if hi_ts < max(lo_ts, 0):
        return lo, lo  # empty
    hi = p + _TS.pack(hi_ts + 1) if hi_ts < MAX_TS else prefix_upper_bound(p)
    return lo, hi


def encode_outer(ts: int, side: int, seq: int, kb: bytes) -> bytes:
    _check_ts(ts)
    return _OUTER_HEAD.pack(ts, side, seq % SEQ_MODULUS) + kb


def decode_outer(data: bytes) -> tuple[int, int, int, bytes]:
    """``(timestamp, side, sequence, key bytes)``."""
    if len(data) < _OUTER_HEAD.size:
        raise ValueError(f"join outer store key too short ({len(data)} bytes)")
    ts, side, seq = _OUTER_HEAD.unpack_from(data)
    if side not in (LEFT, RIGHT):
        raise ValueError(f"join outer store key has unknown side byte {side}")
    return ts, side, seq, data[_OUTER_HEAD.size:]


def outer_of(window_key: bytes, side: int) -> bytes:
    """The outer store key of the record stored under ``window_key`` in ``side``'s window store."""
    kb, ts, seq = decode(window_key)
    return encode_outer(ts, side, seq, kb)


def outer_before(ts: int) -> bytes:
    """Exclusive upper bound of the outer store keys with a timestamp below ``ts`` (>= 0)."""
    return _TS.pack(min(ts, MAX_TS))


class JoinWindowKeySerde:
    """Read-only view of a join window store key: ``(key, timestamp, sequence)``."""

    def __init__(self, inner):
        self.inner = inner

    def serialize(self, key) -> bytes:
        k, ts, seq = key
        return encode(self.inner.serialize(k), ts, seq)

    def deserialize(self, data: bytes):
        kb, ts, seq = decode(data)
        return self.inner.deserialize(kb), ts, seq


class JoinOuterKeySerde:
    """Read-only view of a join outer store key: ``(timestamp, "left" | "right", sequence, key)``."""

    def __init__(self, inner):
        self.inner = inner

    def serialize(self, key) -> bytes:
        ts, side, seq, k = key
        return encode_outer(ts, LEFT if side == "left" else RIGHT, seq, self.inner.serialize(k))

    def deserialize(self, data: bytes):
        ts, side, seq, kb = decode_outer(data)
        return ts, "left" if side == LEFT else "right", seq, self.inner.deserialize(kb)
