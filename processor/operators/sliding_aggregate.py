"""Sliding-window stream aggregation (KIP-450; Kafka Streams' ``KStreamSlidingWindowAggregate``,
the variant that reads a key's windows newest first, as it does over RocksDB).

Invariant: a key's windows are ``[start, start + diff]`` (both ends inclusive), one for each
distinct set of its records that fit in ``diff``: the window ending at each record's time (its
left window) and the window starting just after it (its right window) when that one holds a
record; each window's aggregate folds exactly the records inside it, and its stored timestamp is
the largest record time inside it (which the algorithm reads to decide which windows to create).
Records with ``ts < diff`` share the window ``[0, diff]``. With ``observed`` the largest record
time seen and ``close = observed - grace``: a record with ``ts + 1 + diff <= close`` is dropped
(``late_records_dropped``), an update of a window ending before ``close`` too
(``expired_updates_dropped``); a window is closed once its end is before ``close`` (emitted then
under ``Emit.on_window_close``), read only while its start is after the store's clock (the
largest window start written, kept in the task's bookkeeping) - ``2 x diff + grace`` (Kafka
Streams' window store retention by its own clock), and purged once its end is before ``close -
diff - 1``: a record still accepted (``ts >= close - diff``) reads the window ending at the
record before it (``prev``) to make ``prev``'s right window ``[prev + 1, prev + 1 + diff]``,
open while ``prev >= close - diff - 1`` (found in review: purged one millisecond earlier, a
record at 85 after 84 and 100, diff 10, grace 5, made no ``[85, 95]``). Result keys
``Windowed(key, start, start + diff)``; a result carries its window's timestamp.
"""

from __future__ import annotations

import heapq
import struct

from processor.operators.aggregate import TS, StreamAggregate
from processor.records import Windowed
from processor.state import sliding_key, timestamped

_TIME = struct.Struct(">q")


class SlidingWindowedStreamAggregate(StreamAggregate):
    kind = "sliding-aggregate"
    # Kafka Streams' KStreamSlidingWindowAggregate skips a null key or value (its time and session
    # windows a null key only); found by the differential suite (tests/reference/)
    skips_null_values = True

    def __init__(self, name, store_name, key_serde, value_serde, emit, initializer, aggregator, windows):
        super().__init__(name, store_name, key_serde, value_serde, emit, initializer, aggregator)
        self.diff = windows.diff_ms
        self.grace = windows.grace_ms
        self.punctuates_stream = True
        self.late_records_dropped = 0
        self.expired_updates_dropped = 0
        self.windows_closed = 0
        # the windows by end: those not closed yet, and every stored one (heaps of (end, key),
        # each window once; a window purged since is dropped when met)
        self._to_close: list[tuple[int, bytes]] = []
        self._to_purge: list[tuple[int, bytes]] = []
        self._indexed: set[bytes] = set()
        self._closed_before = None            # windows ending before this are closed
        # Kafka Streams' window store: retention 2 x diff + grace by its own clock, the largest
        # window start put into it (any key); a fetch sees only starts after clock - retention
        # (at least 1 here: Kafka Streams refuses a time difference of 0 at its first record)
        self.retention = max(2 * self.diff + self.grace, 1)
        self._store_time = -1
        self._store_time_key = b"sliding_store_time\x00" + name.encode("utf-8")   # kept with the state

    def init(self, context):
        super().init(context)
        self._closed_before = self.observed_time - self.grace if self.observed_time >= 0 else None
        close = self._closed_before
        raw = self._task_store.get(self._store_time_key)
        self._store_time = -1 if raw is None else _TIME.unpack(raw)[0]
        for k, _ in self.store.items():
            start = sliding_key.decode(k)[1]
            self._store_time = max(self._store_time, start)   # (state written before the clock was kept)
            end = start + self.diff
            self._to_purge.append((end, k))
            if close is None or end >= close:
                self._to_close.append((end, k))
            self._indexed.add(k)
        heapq.heapify(self._to_close)
        heapq.heapify(self._to_purge)

    def _key_of(self, wk):
        kb, start = sliding_key.decode(wk)
        return Windowed(self.key_serde.deserialize(kb), start, start + self.diff)

    # -- the store ---------------------------------------------------------------------------
    def _windows(self, kb: bytes, lo: int, hi: int):
        """``(start, agg, timestamp)`` of ``kb``'s windows with ``lo <= start <= hi``, newest first
        (each aggregate deserialized only when the caller gets that far), and within the store's
        retention (found by the differential suite: a window starting at or before the store's
        clock - retention is no longer read, though not purged yet)."""
        lo = max(lo, self._store_time - self.retention + 1)
        n = len(kb) + sliding_key.START_SIZE
        entries = [(wk, raw) for wk, raw in self.store.range(sliding_key.encode(kb, lo), sliding_key.encode(kb, hi + 1))
                   if len(wk) == n]
        for wk, raw in reversed(entries):
            yield sliding_key.decode(wk)[1], self.value_serde.deserialize(raw[TS:]), timestamped.timestamp_of(raw)

    def _init(self):
        return None if self.initializer is None else self._call(self.initializer)

    def _fold(self, key, value, agg):
        if self.initializer is None:   # reduce
            return value if agg is None else self._call(self.aggregator, agg, value)
        return self._call(self.aggregator, key, value, agg)

    def _write(self, kb, start, agg, ts) -> None:
        wk = sliding_key.encode(kb, start)
        if start > self._store_time:
            self._store_time = start
            self._task_store.put(self._store_time_key, _TIME.pack(start))
        try:
            vb = None if agg is None else self.value_serde.serialize(agg)
        except Exception as exc:
            raise self.serialize_error(self.value_serde, agg, "aggregate value", exc) from exc
        if vb is None:
            self.store.delete(wk)
        else:
            self.store.put(wk, timestamped.encode(ts, vb))
        self.emitter.updated(wk, vb, ts, ts)
        if wk not in self._indexed:   # (a window is written only while it is open)
            self._indexed.add(wk)
            end = start + self.diff
            heapq.heappush(self._to_close, (end, wk))
            heapq.heappush(self._to_purge, (end, wk))

    def _update(self, kb, start, agg, agg_ts, key, value, ts, close) -> None:
        """Add the record to window ``start`` whose aggregate is ``agg`` (None: none yet)."""
        if start + self.diff < close:
            self.expired_updates_dropped += 1
            return
        new_ts = ts if agg is None else max(ts, agg_ts)
        self._write(kb, start, self._fold(key, value, agg), new_ts)

    # -- a record ----------------------------------------------------------------------------
    def process(self, key, value, timestamp):
        begun = self._begin(key, value, timestamp)
        if begun is None:
            return
        kb, advanced = begun
        close = self.observed_time - self.grace
        if timestamp + 1 + self.diff <= close:
            self.late_records_dropped += 1
            self._after(advanced)
            return
        if timestamp < self.diff:
            self._early(kb, key, value, timestamp, close)
        else:
            self._in_time(kb, key, value, timestamp, close)
        self._after(advanced)

    def _in_time(self, kb, key, value, ts, close) -> None:
        d = self.diff
        starts = set()
        left_agg = right = None
        left_exists = right_exists = False
        prev_ts = None
        for start, agg, wts in self._windows(kb, max(0, ts - 2 * d), ts + 1):
            starts.add(start)
            end = start + d
            if start == ts + 1:
                right_exists = True
            elif end > ts:
                if right is None:
                    right = (agg, wts)   # before this record: what the record's right window holds
                self._update(kb, start, agg, wts, key, value, ts, close)
            elif end == ts:
                left_exists = True
                self._update(kb, start, agg, wts, key, value, ts, close)
                if wts < ts:
                    prev_ts = wts
                else:
                    return   # a record at ts was here before: its windows exist
            else:   # end < ts: the newest window before this record's left window
                left_agg = agg
                prev_ts = wts
                break
        if prev_ts is not None:
            prev_right = prev_ts + 1
            if prev_right not in starts and prev_right + d >= ts:
                self._update(kb, prev_right, self._init(), ts, key, value, ts, close)
        if not left_exists:
            agg = left_agg if prev_ts is not None and ts - d <= prev_ts else self._init()
            self._update(kb, ts - d, agg, ts, key, value, ts, close)
        if not right_exists and right is not None and right[1] > ts:
            self._write(kb, ts + 1, right[0], right[1])

    def _early(self, kb, key, value, ts, close) -> None:
        """``0 <= ts < diff``: the record's left window would start before 0; records like it share
        ``[0, diff]``, and their right windows are made as later records come."""
        combined = right = None
        right_exists = False
        starts = set()
        prev_ts = None
        windows = list(self._windows(kb, 0, ts + 1))
        windows.reverse()   # oldest first
        for start, agg, wts in windows:
            starts.add(start)
            if start == 0:
                combined = (agg, wts)
                if wts < ts:
                    prev_ts = wts
            elif start <= ts:
                right = (agg, wts)
                self._update(kb, start, agg, wts, key, value, ts, close)
            elif start == ts + 1:
                right_exists = True
        if right is None and combined is not None and combined[1] > ts:
            right = combined
        if not right_exists and right is not None and right[1] > ts:
            self._write(kb, ts + 1, right[0], right[1])
        if prev_ts is not None and prev_ts + 1 not in starts:
            self._update(kb, prev_ts + 1, self._init(), ts, key, value, ts, close)
        if combined is None:
            self._update(kb, 0, self._init(), ts, key, value, ts, close)
        else:
            self._update(kb, 0, combined[0], combined[1], key, value, ts, close)

    # -- stream time ---------------------------------------------------------------------------
    def punctuate_stream(self, stream_time: int) -> None:
        if self.emit.mode == "every" and self.emit.clock == "stream":
            self.emitter.punctuate(stream_time)
        close = stream_time - self.grace
        final = self.emit.mode == "on_window_close"
        closing = []
        while self._to_close and self._to_close[0][0] < close:
            end, wk = heapq.heappop(self._to_close)
            raw = self.store.get(wk)
            if raw is not None:
                closing.append((end, wk, raw))
        for _, wk, raw in sorted(closing):   # in the order they closed: by end, then key
            if final:
                self.emitter.window_closed(wk, raw[TS:], timestamped.timestamp_of(raw))
            else:
                self.emitter.emit_pending(wk)
        self.windows_closed += len(closing)
        while self._to_purge and self._to_purge[0][0] < close - self.diff - 1:
            _, wk = heapq.heappop(self._to_purge)
            self._indexed.discard(wk)
            self.store.delete(wk)
            self.emitter.forget(wk)
        self._closed_before = close

    def metrics(self):
        return {**super().metrics(), "late_records_dropped": self.late_records_dropped,
                "expired_updates_dropped": self.expired_updates_dropped, "windows_closed": self.windows_closed}
