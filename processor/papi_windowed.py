"""Window and session stores of the Processor API (``Stores.window`` / ``Stores.session``).

As a user processor sees them (``context.get_state_store(name)``): keys and values as objects
through the store's serdes, over the raw store whose key layout
``processor/state/papi_window_key.py`` documents.

Invariants (Kafka Streams' ``RocksDBWindowStore`` / ``RocksDBSessionStore`` over
``AbstractRocksDBSegmentedBytesStore``, read for each rule):
- Each store has its own observed stream time: the largest window start (window store) or
  session end (session store) ever put or removed, whether or not the put was kept (Kafka
  Streams' ``observedStreamTime``; not the task's stream time). It is kept in the task's
  bookkeeping with the duplicates' sequence, so a restored task, the backfill and the worker go
  on alike.
- Retention: an entry whose window start (session end) is at or before ``observed -
  retention_ms`` is expired. A put of an expired entry is dropped (counted in the processor's
  ``expired_puts_dropped``); fetches never return an expired entry (Kafka Streams' fetches
  start at ``observed - retention + 1``). Kafka Streams drops puts a whole segment at a time
  and keeps the rest of an expiring segment invisible; here the drop is exact and the storage
  is purged a segment at a time, the same segments (``segment_interval``): what reads return
  is the same.
- Window store: ``put(key, value, window_start)`` replaces the key's entry of that window, and
  ``None`` deletes it; with ``retain_duplicates=True`` every put is a new entry (the next
  sequence number), in put order within a window, and a ``None`` put is ignored altogether
  (it does not even move the observed time), as Kafka Streams'.
- Session store: ``put(Windowed(key, start, end), value)`` (``None`` removes); a session is
  ``[start, end]``, both ends inclusive, as Kafka Streams' ``SessionWindow``.
- Every entry's value is stored behind the timestamp of the record (or punctuation) that wrote
  it, as the key-value stores' are.
- Order: ``fetch`` by window start; ``fetch_all`` by window start, then key bytes, then
  sequence (Kafka Streams' in-memory store's order); ``find_sessions`` by session end, then
  start; ``backward_*`` the reverse. Results are lists (a snapshot: writing while iterating is
  safe).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.records import Windowed
from processor.state import papi_window_key as codec
from processor.state import timestamped

__all__ = ["WindowStore", "SessionStore", "ReadOnlyWindowedStore"]


class _Windowed:
    """What both stores share: the raw store, the bookkeeping entry, retention and the purge."""

    def __init__(self, name: str, raw: Any, bookkeeping: Any, key_codec: Any, value_serde: Any,
                 clock: Callable[[], int]):
        self.name = name
        self._raw = raw
        self._book = bookkeeping
        self._bkey = codec.bookkeeping_key(name)
        self._codec = key_codec
        self._ks = key_codec.inner
        self._vs = value_serde
        self._clock = clock
        self.retention_ms = key_codec.retention_ms
        self._interval = key_codec.segment_interval
        self.expired_puts_dropped = 0

    # -- the store's clock ---------------------------------------------------------------------
    def _state(self) -> tuple[int, int]:
        return codec.decode_bookkeeping(self._book.get(self._bkey))

    @property
    def observed_stream_time(self) -> int:
        """The largest window start / session end put or removed (-1: none yet)."""
        return self._state()[0]

    def _advance(self, t: int, seq: int | None = None) -> int:
        """Observe time ``t`` (and keep ``seq``); purge what expired; the new observed time."""
        observed, old_seq = self._state()
        new = max(observed, t)
        seq = old_seq if seq is None else seq
        if new != observed or seq != old_seq:
            self._book.put(self._bkey, codec.encode_bookkeeping(new, seq))
        if new != observed:
            self._purge(observed, new)
        return new

    def _min_live_segment(self, observed: int) -> int:
        return (observed - self.retention_ms) // self._interval

    def _purge(self, old: int, new: int) -> None:
        """Drops the segments that no longer hold a live entry, when the oldest live segment moved.

        Kafka Streams' ``cleanupExpiredSegments``.
        """
        seg = self._min_live_segment(new)
        if seg <= 0 or (old >= 0 and seg <= self._min_live_segment(old)):
            return
        doomed = [k for k, _ in self._raw.range(codec.store_start(), codec.before_segment(seg))]
        for k in doomed:
            self._raw.delete(k)

    def _expired(self, t: int, observed: int) -> bool:
        return t <= observed - self.retention_ms

    def _live_from(self, t: int, observed: int) -> int:
        return max(t, observed - self.retention_ms + 1, 0)

    def _value(self, raw: bytes) -> Any:
        return self._vs.deserialize(raw[timestamped.TIMESTAMP_SIZE:])

    def _encode_value(self, value: Any) -> bytes:
        return timestamped.encode(self._clock(), self._vs.serialize(value))


class WindowStore(_Windowed):
    """A ``Stores.window`` store (Kafka Streams' ``WindowStore``)."""

    def __init__(self, name: str, raw: Any, bookkeeping: Any, key_codec: Any, value_serde: Any,
                 clock: Callable[[], int]):
        super().__init__(name, raw, bookkeeping, key_codec, value_serde, clock)
        self.window_size_ms = key_codec.window_size_ms
        self.retain_duplicates = key_codec.retain_duplicates

    def put(self, key: Any, value: Any, window_start: int) -> None:
        """Sets the value of ``key``'s window starting at ``window_start`` (Kafka Streams: ``WindowStore#put``).

        Args:
            key: The key.
            value: The value; None deletes the window's entry (ignored with duplicates).
            window_start: The window's start, in ms.
        """
        if value is None and self.retain_duplicates:
            return     # Kafka Streams: a delete is a no-op among duplicates
        kb = self._ks.serialize(key)
        codec.check_ts("window start", window_start)
        seq = 0
        if self.retain_duplicates:
            seq = (self._state()[1] + 1) & codec.SEQ_MASK
            observed = self._advance(window_start, seq)
        else:
            observed = self._advance(window_start)
        if self._expired(window_start, observed):
            self.expired_puts_dropped += 1
            return
        sk = codec.encode_window(kb, window_start, seq, self._interval)
        if value is None:
            if self._raw.get(sk) is not None:
                self._raw.delete(sk)
        else:
            self._raw.put(sk, self._encode_value(value))

    def live_entries(self, kb: bytes, time_from: int = 0, time_to: int = codec.MAX_TS) -> list:
        """``[(store key, stored value)]`` of key bytes ``kb``'s live windows starting in ``[time_from, time_to]``.

        In time order (interactive queries read these).
        """
        observed = self.observed_stream_time
        lo, hi = self._live_from(time_from, observed), min(time_to, observed)
        out: list[Any] = []
        if hi < lo:
            return out
        for seg in range(lo // self._interval, hi // self._interval + 1):
            a, b = codec.window_bounds(seg, kb, lo, hi)
            out.extend(self._raw.range(a, b))
        return out

    def fetch(self, key: Any, time_from: int, time_to: int) -> list:
        """``key``'s windows starting in ``[time_from, time_to]`` (Kafka Streams: ``WindowStore#fetch``).

        Both ends inclusive; in time order (duplicates in put order).

        Returns:
            ``[(window_start, value)]``.
        """
        return [(codec.decode_window(k)[1], self._value(v))
                for k, v in self.live_entries(self._ks.serialize(key), time_from, time_to)]

    def backward_fetch(self, key: Any, time_from: int, time_to: int) -> list:
        """As ``fetch``, in reverse order (Kafka Streams: ``WindowStore#backwardFetch``)."""
        return self.fetch(key, time_from, time_to)[::-1]

    def fetch_all(self, time_from: int, time_to: int) -> list:
        """Every window starting in ``[time_from, time_to]`` (Kafka Streams: ``WindowStore#fetchAll``).

        By start, then key bytes, then put order.

        Returns:
            ``[(Windowed(key, start, start + size), value)]``.
        """
        observed = self.observed_stream_time
        lo, hi = self._live_from(time_from, observed), min(time_to, observed)
        rows = []
        if hi >= lo:
            for seg in range(lo // self._interval, hi // self._interval + 1):
                for k, v in self._raw.range(codec.segment_prefix(seg), codec.segment_prefix(seg + 1)):
                    kb, start, seq = codec.decode_window(k)
                    if lo <= start <= hi:
                        rows.append((start, kb, seq, v))
        rows.sort(key=lambda r: r[:3])
        size = self.window_size_ms
        return [(Windowed(self._ks.deserialize(kb), start, start + size), self._value(v))
                for start, kb, _, v in rows]

    def backward_fetch_all(self, time_from: int, time_to: int) -> list:
        """As ``fetch_all``, in reverse order (Kafka Streams: ``WindowStore#backwardFetchAll``)."""
        return self.fetch_all(time_from, time_to)[::-1]

    def all(self) -> list:
        """Every live window, as ``fetch_all`` (Kafka Streams: ``WindowStore#all``)."""
        return self.fetch_all(0, codec.MAX_TS)

    def backward_all(self) -> list:
        """As ``all``, in reverse order (Kafka Streams: ``WindowStore#backwardAll``)."""
        return self.all()[::-1]


class SessionStore(_Windowed):
    """A ``Stores.session`` store (Kafka Streams' ``SessionStore``).

    Keys are ``Windowed(key, start, end)``, a session's first and last record times.
    """

    def _check(self, windowed: Any) -> bytes:
        if not isinstance(windowed, Windowed):
            raise TypeError(f"session store {self.name!r}: a key is a Windowed(key, start, end), not {windowed!r}")
        return codec.encode_session(self._ks.serialize(windowed.key), windowed.start, windowed.end, self._interval)

    def put(self, windowed: Windowed, value: Any) -> None:
        """Sets the value of session ``windowed`` (Kafka Streams: ``SessionStore#put``).

        Args:
            windowed: ``Windowed(key, start, end)``.
            value: The value; None removes the session.

        Raises:
            TypeError: ``windowed`` is no ``Windowed``.
        """
        if value is None:
            self.remove(windowed)
            return
        sk = self._check(windowed)
        observed = self._advance(windowed.end)
        if self._expired(windowed.end, observed):
            self.expired_puts_dropped += 1
            return
        self._raw.put(sk, self._encode_value(value))

    def remove(self, windowed: Windowed) -> None:
        """Removes session ``windowed`` (Kafka Streams: ``SessionStore#remove``).

        Its end moves the observed time, as Kafka Streams'.
        """
        sk = self._check(windowed)
        self._advance(windowed.end)
        if self._raw.get(sk) is not None:
            self._raw.delete(sk)

    def fetch_session(self, key: Any, start: int, end: int) -> Any:
        """The value of session ``[start, end]`` of ``key``, or None (also when expired).

        Kafka Streams: ``SessionStore#fetchSession``.
        """
        sk = codec.encode_session(self._ks.serialize(key), start, end, self._interval)
        if self._expired(end, self.observed_stream_time):
            return None
        raw = self._raw.get(sk)
        return None if raw is None else self._value(raw)

    def find_sessions(self, key: Any, earliest_session_end: int, latest_session_start: int) -> list:
        """``key``'s sessions overlapping a time range (Kafka Streams: ``SessionStore#findSessions``).

        The sessions ending at or after ``earliest_session_end`` and starting at or before
        ``latest_session_start``, by end, then start.

        Returns:
            ``[(Windowed(key, start, end), value)]``.
        """
        out: list[Any] = []
        for k, v in self.live_entries(self._ks.serialize(key), earliest_session_end):
            _, start, end = codec.decode_session(k)
            if start <= latest_session_start:
                out.append((Windowed(key, start, end), self._value(v)))
        return out

    def live_entries(self, kb: bytes, earliest_session_end: int = 0) -> list:
        """``[(store key, stored value)]`` of key bytes ``kb``'s live sessions ending at or after a time.

        By end, then start (interactive queries read these).
        """
        observed = self.observed_stream_time
        lo = self._live_from(earliest_session_end, observed)
        out: list[Any] = []
        if observed < lo:
            return out
        for seg in range(lo // self._interval, observed // self._interval + 1):
            a, b = codec.session_bounds(seg, kb, lo)
            out.extend(self._raw.range(a, b))
        return out

    def backward_find_sessions(self, key: Any, earliest_session_end: int, latest_session_start: int) -> list:
        """As ``find_sessions``, in reverse order (Kafka Streams: ``SessionStore#backwardFindSessions``)."""
        return self.find_sessions(key, earliest_session_end, latest_session_start)[::-1]

    def fetch(self, key: Any) -> list:
        """Every live session of ``key`` (``find_sessions(key, 0, MAX)``; Kafka Streams: ``SessionStore#fetch``)."""
        return self.find_sessions(key, 0, codec.MAX_TS)

    def backward_fetch(self, key: Any) -> list:
        """As ``fetch``, in reverse order (Kafka Streams: ``SessionStore#backwardFetch``)."""
        return self.fetch(key)[::-1]

    def all(self) -> list:
        """Every live session of every key, by key bytes, then end, then start."""
        observed = self.observed_stream_time
        lo = self._live_from(0, observed)
        rows = []
        for k, v in self._raw.items():
            kb, start, end = codec.decode_session(k)
            if end >= lo:
                rows.append((kb, end, start, v))
        rows.sort(key=lambda r: r[:3])
        return [(Windowed(self._ks.deserialize(kb), start, end), self._value(v)) for kb, end, start, v in rows]


_READS = {
    "window": ("fetch", "backward_fetch", "fetch_all", "backward_fetch_all", "all", "backward_all",
               "observed_stream_time", "name", "retention_ms", "window_size_ms", "retain_duplicates"),
    "session": ("find_sessions", "backward_find_sessions", "fetch", "backward_fetch", "fetch_session", "all",
                "observed_stream_time", "name", "retention_ms"),
}


class ReadOnlyWindowedStore:
    """A window or session store's reads only (the test driver's ``get_store``), plus ``raw()``.

    Kafka Streams: ``ReadOnlyWindowStore`` / ``ReadOnlySessionStore``.
    """

    def __init__(self, kind: str, store: _Windowed, raw: Any):
        self.kind = kind
        self._store = store
        self._raw_store = raw

    def __getattr__(self, name: str) -> Any:
        if name in _READS[self.__dict__["kind"]]:
            return getattr(self._store, name)
        raise AttributeError(f"{self.kind} store {self._store.name!r} is read-only here: no {name!r}")

    def raw(self) -> list:
        """Every stored entry, expired or not, as ``(key, value)`` with the store key decoded."""
        return [(self._store._codec.deserialize(k), self._store._value(v)) for k, v in self._raw_store.items()]

    def __len__(self) -> int:
        return sum(1 for _ in self._raw_store.items())
