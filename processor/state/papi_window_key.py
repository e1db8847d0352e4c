"""Key codecs of the Processor API's window and session stores (contracts;
``Stores.window`` / ``Stores.session``, ``processor/papi_windowed.py``).

Window store (``Stores.window(name, retention_ms, window_size_ms, retain_duplicates)``)::

    {1-byte version = 1}{8-byte BE segment id}{4-byte BE key length}{key bytes}
    {8-byte BE window start (ms, >= 0)}{4-byte BE sequence}

Session store (``Stores.session(name, retention_ms)``)::

    {1-byte version = 1}{8-byte BE segment id}{4-byte BE key length}{key bytes}
    {8-byte BE session end (ms, >= 0)}{8-byte BE session start (ms, >= 0)}

Values of both are the timestamped layout (``processor/state/timestamped.py``):
``{8-byte BE timestamp of the record that wrote it}{value serde bytes}``.

The segment id is ``window start // segment interval`` (a session's: its end's), with Kafka
Streams' default interval for a persistent window store, ``max(retention // 2, 60_000)``: the
shape of Kafka Streams' segmented stores (``AbstractRocksDBSegmentedBytesStore``: one database
per segment, ``WindowKeySchema`` / ``SessionKeySchema`` inside), here in one column family.
Segment first, so what retention drops is one range scan from the beginning of the store
(``before_segment``); then the key, length-prefixed (key ``ab`` never matches a scan for ``a``
or ``abc``), so one key's entries of one segment are one range scan, in time order. The
sequence is 0 unless the store retains duplicates; then each put takes the next one
(``(n + 1) & 0x7FFFFFFF``, as Kafka Streams' ``RocksDBWindowStore``), kept with the store's
observed stream time in the task's bookkeeping (``bookkeeping_key``), so a restored task goes
on where it was (Kafka Streams keeps the counter in memory only and starts it again at 0).

Bookkeeping entry (``_bookkeeping``, key ``papi-window\\x00<store>``)::

    {1-byte version = 1}{8-byte BE observed stream time (-1: none yet)}{4-byte BE sequence}

Versions other than 1 are refused (``ValueError``), never guessed.
"""

from __future__ import annotations

import struct

VERSION = 1
_V = bytes([VERSION])
_SEG = struct.Struct(">q")
_LEN = struct.Struct(">I")
_WTAIL = struct.Struct(">qI")      # window start, sequence
_STAIL = struct.Struct(">qq")      # session end, session start
_BOOK = struct.Struct(">Bqi")      # version, observed stream time, sequence
MAX_TS = (1 << 63) - 1
SEQ_MASK = 0x7FFFFFFF
NO_TIME = -1


def segment_interval(retention_ms: int) -> int:
    """Kafka Streams' default segment interval of a persistent window / session store."""
    return max(retention_ms // 2, 60_000)


def check_ts(what: str, ts) -> None:
    if not isinstance(ts, int) or isinstance(ts, bool) or not 0 <= ts <= MAX_TS:
        raise ValueError(f"a {what} is an int in [0, 2**63) ms, not {ts!r}")


def _check_version(data: bytes, what: str) -> None:
    if not data or data[0] != VERSION:
        raise ValueError(f"{what} store key of version {data[0] if data else None} "
                         f"(this build reads version {VERSION})")


def segment_prefix(segment: int) -> bytes:
    return _V + _SEG.pack(max(segment, 0))


def before_segment(segment: int) -> bytes:
    """Exclusive upper bound of every key of a segment below ``segment``."""
    return segment_prefix(segment)


def store_start() -> bytes:
    return segment_prefix(0)


def key_prefix(segment: int, kb: bytes) -> bytes:
    return segment_prefix(segment) + _LEN.pack(len(kb)) + kb


# -- window store ------------------------------------------------------------------------------
def encode_window(kb: bytes, start: int, seq: int, interval: int) -> bytes:
    check_ts("window start", start)
    return key_prefix(start // interval, kb) + _WTAIL.pack(start, seq & SEQ_MASK)


def decode_window(data: bytes) -> tuple[bytes, int, int]:
    """``(key bytes, window start, sequence)``."""
    _check_version(data, "window")
    if len(data) < 1 + 8 + 4 + 12:
        raise ValueError(f"window store key too short ({len(data)} bytes)")
    n = _LEN.unpack_from(data, 9)[0]
    if len(data) != 13 + n + 12:
        raise ValueError(f"window store key of {len(data)} bytes does not match key length {n}")
    start, seq = _WTAIL.unpack_from(data, 13 + n)
    return data[13:13 + n], start, seq


def window_bounds(segment: int, kb: bytes, lo: int, hi: int) -> tuple[bytes, bytes]:
    """Half-open bounds of key ``kb``'s entries of ``segment`` with ``lo <= start <= hi``
    (``0 <= lo <= hi``)."""
    p = key_prefix(segment, kb)
    upper = p + _WTAIL.pack(hi + 1, 0) if hi < MAX_TS else p + b"\xff" * 13
    return p + _WTAIL.pack(lo, 0), upper


# -- session store -----------------------------------------------------------------------------
def encode_session(kb: bytes, start: int, end: int, interval: int) -> bytes:
    check_ts("session start", start)
    check_ts("session end", end)
    if end < start:
        raise ValueError(f"a session ends at or after its start, not [{start}, {end}]")
    return key_prefix(end // interval, kb) + _STAIL.pack(end, start)


def decode_session(data: bytes) -> tuple[bytes, int, int]:
    """``(key bytes, session start, session end)``."""
    _check_version(data, "session")
    if len(data) < 1 + 8 + 4 + 16:
        raise ValueError(f"session store key too short ({len(data)} bytes)")
    n = _LEN.unpack_from(data, 9)[0]
    if len(data) != 13 + n + 16:
        raise ValueError(f"session store key of {len(data)} bytes does not match key length {n}")
    end, start = _STAIL.unpack_from(data, 13 + n)
    return data[13:13 + n], start, end


def session_bounds(segment: int, kb: bytes, earliest_end: int) -> tuple[bytes, bytes]:
    """Half-open bounds of key ``kb``'s sessions of ``segment`` ending at or after ``earliest_end``."""
    p = key_prefix(segment, kb)
    return p + _STAIL.pack(max(earliest_end, 0), 0), p + b"\xff" * 17


def decode_any(data: bytes) -> tuple[int, bytes]:
    """``(segment id, key bytes)`` of either store's key (``segment_of`` for the purge)."""
    _check_version(data, "window/session")
    seg = _SEG.unpack_from(data, 1)[0]
    n = _LEN.unpack_from(data, 9)[0]
    return seg, data[13:13 + n]


# -- bookkeeping -------------------------------------------------------------------------------
def bookkeeping_key(store: str) -> bytes:
    return b"papi-window\x00" + store.encode("utf-8")


def encode_bookkeeping(observed: int, seq: int) -> bytes:
    return _BOOK.pack(VERSION, observed, seq)


def decode_bookkeeping(data: bytes | None) -> tuple[int, int]:
    """``(observed stream time, sequence)``; ``(-1, 0)`` for none yet."""
    if data is None:
        return NO_TIME, 0
    if len(data) != _BOOK.size or data[0] != VERSION:
        raise ValueError(f"window store bookkeeping entry of version {data[0] if data else None}, "
                         f"{len(data)} bytes (this build reads version {VERSION}, {_BOOK.size} bytes)")
    _, observed, seq = _BOOK.unpack(data)
    return observed, seq


class WindowStoreKeyCodec:
    """The store key serde of a ``Stores.window`` store as the topology sees it (state dump,
    the driver's ``get_store``): store key bytes <-> ``(Windowed(key, start, start + size), seq)``;
    also carries the store's settings (``inner`` is the user's key serde)."""

    kind = "window"

    def __init__(self, inner, window_size_ms: int, retention_ms: int, retain_duplicates: bool):
        self.inner = inner
        self.window_size_ms = window_size_ms
        self.retention_ms = retention_ms
        self.retain_duplicates = retain_duplicates
        self.segment_interval = segment_interval(retention_ms)

    def serialize(self, key) -> bytes:
        windowed, seq = key
        return encode_window(self.inner.serialize(windowed.key), windowed.start, seq, self.segment_interval)

    def deserialize(self, data: bytes):
        from processor.records import Windowed

        kb, start, seq = decode_window(data)
        return Windowed(self.inner.deserialize(kb), start, start + self.window_size_ms), seq

    def __repr__(self):
        return (f"WindowStoreKeyCodec({self.inner!r}, size={self.window_size_ms}, retention={self.retention_ms}, "
                f"retain_duplicates={self.retain_duplicates})")


class SessionStoreKeyCodec:
    """The store key serde of a ``Stores.session`` store: store key bytes <->
    ``Windowed(key, start, end)`` (``inner`` is the user's key serde)."""

    kind = "session"

    def __init__(self, inner, retention_ms: int):
        self.inner = inner
        self.retention_ms = retention_ms
        self.segment_interval = segment_interval(retention_ms)

    def serialize(self, key) -> bytes:
        return encode_session(self.inner.serialize(key.key), key.start, key.end, self.segment_interval)

    def deserialize(self, data: bytes):
        from processor.records import Windowed

        kb, start, end = decode_session(data)
        return Windowed(self.inner.deserialize(kb), start, end)

    def __repr__(self):
        return f"SessionStoreKeyCodec({self.inner!r}, retention={self.retention_ms})"
