"""Aggregations: grouped tables and grouped streams, plain and windowed.

Invariant: the store ``<store>`` holds, per group key (per window and key for windowed
aggregates), the current aggregate's bytes and the timestamp of its last REAL change; an update
that leaves the bytes unchanged writes nothing and keeps that timestamp (KIP-557), except under
``Emit.on_update()``, the opt-out, where it stores its later timestamp as Kafka Streams does. What is
forwarded, and when, is decided by the aggregate's emission policy (``operators/emission.py``)
against the last-emitted column ``<store>.emitted``.

Table aggregation (``KGroupedTable``): a ``Change(new, old)`` for a group subtracts ``old`` and
adds ``new`` in one step, as Kafka Streams' KTableAggregate: the subtractor runs only when the
group has an aggregate, the initializer only when it has none. An aggregate (or a reduce) whose
result is None is deleted. ``count`` is an aggregate that stays at 0 when its last row leaves,
as in Kafka Streams.

Stream aggregation (``KGroupedStream``): records with a null key or value are skipped and
counted (``skipped_null``), as in Kafka Streams.

Stream time, per aggregate (as Kafka Streams' observed stream time): the largest timestamp of
the records that reached this aggregate, this one included; it is kept in the task store
(``observed_time\x00<operator>``) and committed with the state. It is the clock of windows and
of ``Emit.every(n)`` on stream time. An aggregate's timestamp never goes backwards: a real
change carries max(record, previous aggregate) timestamps, as in Kafka Streams.

Windowed aggregation (``TimeWindowedKStream``): a record at ``ts`` updates every window
``[start, start + size)`` that contains it (starts are multiples of the advance, never negative).
A window is closed once stream time reaches ``end + grace``; a record for a closed window is not
applied to it and, when all of its windows are closed, counted in ``late_records_dropped``.
Closed windows are emitted (under ``Emit.on_window_close``; a deferred ``Emit.every`` emission
goes out first) and then purged from both columns.
"""

from __future__ import annotations

import struct
from typing import Any, cast

from processor.operators.base import Processor
from processor.operators.emission import AggregateEmitter
from processor.operators.sink import reads_old_values
from processor.records import Windowed
from processor.state import timestamped, window_key
from processor.state.store import BOOKKEEPING_STORE

TS = timestamped.TIMESTAMP_SIZE
_TIME = struct.Struct(">q")


class _Aggregate(Processor):
    kind = "aggregate"

    def __init__(self, name, store_name, key_serde, value_serde, emit):
        super().__init__(name)
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.emit = emit
        self.records_in = 0
        self.store: Any = None                  # the aggregate's store (set by init)
        self.emitter = cast(AggregateEmitter, None)   # set by init
        self.punctuates_stream = emit.mode == "every" and emit.clock == "stream"
        self.punctuates_wall = emit.mode == "every" and emit.clock == "wall"
        self.stores_noops = emit.mode == "on_update"
        self.observed_time = -1
        self._time_key = b"observed_time\x00" + name.encode("utf-8")

    def init(self, context):
        super().init(context)
        self.store = context.get_store(self.store_name)
        self._task_store = context.get_store(BOOKKEEPING_STORE)
        raw = self._task_store.get(self._time_key)
        self.observed_time = -1 if raw is None else _TIME.unpack(raw)[0]
        if self.emit.mode == "every" and self.emit.clock == "wall":
            clock = context.wall_clock
        else:
            clock = lambda: self.observed_time  # noqa: E731
        send_old = reads_old_values(self.children)
        # (the serde's own method where ``_key_of`` is the plain one: a call less per emission)
        key_of = self.key_serde.deserialize if type(self)._key_of is _Aggregate._key_of else self._key_of
        # (the bound method, looked up: in the compiled build ``self.forward`` names the C method)
        forward = getattr(self, "forward")  # noqa: B009
        self.emitter = AggregateEmitter(self.emit, self.store, context.get_store(self.store_name + ".emitted"),
                                        self.value_serde, key_of, forward, clock, context, send_old)

    def _key_of(self, kb):
        return self.key_serde.deserialize(kb)

    def _observe(self, ts) -> bool:
        """Advance this aggregate's stream time; True when it moved."""
        if ts > self.observed_time:
            self.observed_time = ts
            self._task_store.put(self._time_key, _TIME.pack(ts))
            return True
        return False

    def _after(self, advanced: bool) -> None:
        if advanced and self.punctuates_stream:
            self.punctuate_stream(self.observed_time)

    def _current(self, kb):
        raw = self.store.get(kb)
        return raw, (None if raw is None else self.value_serde.deserialize(raw[TS:]))

    def _put(self, kb, raw, new_value, ts) -> None:
        """Store the new aggregate (None: delete) and let the emission policy see the update."""
        if new_value is None:
            new_bytes = None
        else:
            try:
                new_bytes = self.value_serde.serialize(new_value)
            except Exception as exc:
                raise self.serialize_error(self.value_serde, new_value, "aggregate value", exc) from exc
        # (the timestamped layout, state/timestamped.py: {8-byte BE timestamp}{value bytes})
        if raw is None:
            if new_bytes is not None:
                self.store.put(kb, _TIME.pack(ts) + new_bytes)
            value_ts = record_ts = ts
        else:
            old_ts = _TIME.unpack_from(raw)[0]
            if new_bytes != raw[TS:]:
                # as Kafka Streams: an aggregate's timestamp never goes backwards
                value_ts = record_ts = ts if ts > old_ts else old_ts
                if new_bytes is None:
                    self.store.delete(kb)
                else:
                    self.store.put(kb, _TIME.pack(value_ts) + new_bytes)
            else:
                value_ts = old_ts      # a no-op keeps the last real change's
                record_ts = ts if ts > old_ts else old_ts
                if self.stores_noops and ts > old_ts:
                    # Emit.on_update(), the opt-out of the no-op rule: as Kafka Streams, the
                    # stored timestamp advances with every update, no-ops too
                    self.store.put(kb, _TIME.pack(ts) + new_bytes)
        self.emitter.updated(kb, new_bytes, record_ts, value_ts)

    def _call(self, fn, *args):
        """``fn(*args)``, a user function (errors translated by ``user_error``)."""
        try:
            return fn(*args)
        except Exception as exc:
            raise self.user_error(fn, exc) from exc

    def punctuate_stream(self, stream_time: int) -> None:
        self.emitter.punctuate(stream_time)

    def punctuate_wall(self, now: int) -> None:
        self.emitter.punctuate(now)

    def flush(self) -> None:
        self.emitter.flush()

    def metrics(self):
        return {"records_in": self.records_in, **self.emitter.metrics()}


class TableAggregate(_Aggregate):
    """``KGroupedTable.aggregate/reduce/count``: input ``Change(new, old)`` per group key.

    ``initializer`` None means reduce: the first value is the aggregate, and adder/subtractor
    take ``(agg, value)``; otherwise they take ``(key, value, agg)``.
    """

    def __init__(self, name, store_name, key_serde, value_serde, emit, initializer, adder, subtractor):
        super().__init__(name, store_name, key_serde, value_serde, emit)
        self.initializer = initializer
        self.adder = adder
        self.subtractor = subtractor

    def process(self, key, change, timestamp):
        self.records_in += 1
        advanced = self._observe(timestamp)
        try:
            kb = self.key_serde.serialize(key)
        except Exception as exc:
            raise self.serialize_error(self.key_serde, key, "group key", exc) from exc
        raw, agg = self._current(kb)
        reduce = self.initializer is None
        if change.old is not None and agg is not None:
            agg = (self._call(self.subtractor, agg, change.old) if reduce
                   else self._call(self.subtractor, key, change.old, agg))
        if change.new is not None:
            if agg is None:
                agg = (change.new if reduce
                       else self._call(self.adder, key, change.new, self._call(self.initializer)))
            else:
                agg = (self._call(self.adder, agg, change.new) if reduce
                       else self._call(self.adder, key, change.new, agg))
        self._put(kb, raw, agg, timestamp)
        self._after(advanced)


class StreamAggregate(_Aggregate):
    """``KGroupedStream.aggregate/reduce/count``: input plain values per group key."""

    def __init__(self, name, store_name, key_serde, value_serde, emit, initializer, aggregator):
        super().__init__(name, store_name, key_serde, value_serde, emit)
        self.initializer = initializer
        self.aggregator = aggregator
        self.skipped_null = 0

    def _next(self, key, value, agg):
        if self.initializer is None:  # reduce
            return value if agg is None else self._call(self.aggregator, agg, value)
        if agg is None:
            agg = self._call(self.initializer)
        return self._call(self.aggregator, key, value, agg)

    # Kafka Streams' KStreamAggregate/KStreamReduce skip a null value; its windowed aggregations
    # of time and session windows skip only a null key and hand a null value to the aggregator;
    # KStreamSlidingWindowAggregate skips a null value too
    skips_null_values = True

    def _begin(self, key, value, timestamp):
        """A record's first steps: ``(key bytes, whether stream time advanced)``, or None for a
        record with a null key, or a null value where ``skips_null_values`` (skipped and counted,
        as in Kafka Streams)."""
        if key is None or (value is None and self.skips_null_values):
            self.skipped_null += 1
            return None
        self.records_in += 1
        advanced = self._observe(timestamp)
        try:
            kb = self.key_serde.serialize(key)
        except Exception as exc:
            raise self.serialize_error(self.key_serde, key, "group key", exc) from exc
        return kb, advanced

    def process(self, key, value, timestamp):
        # ``_begin``, ``_current``, ``_next`` and ``_after`` inline (the windowed subclasses call them)
        if key is None or (value is None and self.skips_null_values):
            self.skipped_null += 1
            return
        self.records_in += 1
        advanced = timestamp > self.observed_time
        if advanced:
            self.observed_time = timestamp
            self._task_store.put(self._time_key, _TIME.pack(timestamp))
        try:
            kb = self.key_serde.serialize(key)
        except Exception as exc:
            raise self.serialize_error(self.key_serde, key, "group key", exc) from exc
        raw = self.store.get(kb)
        agg = None if raw is None else self.value_serde.deserialize(raw[TS:])
        initializer = self.initializer
        if initializer is None:  # reduce
            if agg is None:
                agg = value
            else:
                try:
                    agg = self.aggregator(agg, value)
                except Exception as exc:
                    raise self.user_error(self.aggregator, exc) from exc
        else:
            if agg is None:
                try:
                    agg = initializer()
                except Exception as exc:
                    raise self.user_error(initializer, exc) from exc
            try:
                agg = self.aggregator(key, value, agg)
            except Exception as exc:
                raise self.user_error(self.aggregator, exc) from exc
        self._put(kb, raw, agg, timestamp)
        if advanced and self.punctuates_stream:
            self.punctuate_stream(self.observed_time)

    def metrics(self):
        return {**super().metrics(), "skipped_null": self.skipped_null}


class WindowedStreamAggregate(StreamAggregate):
    """``TimeWindowedKStream.aggregate/reduce/count``: one aggregate per (window, key)."""

    skips_null_values = False

    def __init__(self, name, store_name, key_serde, value_serde, emit, initializer, aggregator, windows):
        super().__init__(name, store_name, key_serde, value_serde, emit, initializer, aggregator)
        self.size = windows.size_ms
        self.advance = windows.advance_ms
        self.grace = windows.grace_ms
        self.punctuates_stream = True  # windows close on stream time
        self.late_records_dropped = 0
        self.windows_closed = 0
        self._earliest_start: int | None = None

    def init(self, context):
        super().init(context)
        first = next(iter(self.store.items()), None)
        self._earliest_start = None if first is None else window_key.decode(first[0])[0]

    def _key_of(self, wk):
        start, kb = window_key.decode(wk)
        return Windowed(self.key_serde.deserialize(kb), start, start + self.size)

    def process(self, key, value, timestamp):
        begun = self._begin(key, value, timestamp)
        if begun is None:
            return
        kb, advanced = begun
        stream_time = self.observed_time
        first = max(0, timestamp - self.size + self.advance) // self.advance * self.advance
        applied = False
        for start in range(first, timestamp + 1, self.advance):
            if start + self.size + self.grace <= stream_time:
                continue  # this window is closed
            if not start <= timestamp < start + self.size:
                continue
            wk = window_key.encode(start, kb)
            raw, agg = self._current(wk)
            self._put(wk, raw, self._next(key, value, agg), timestamp)
            if self._earliest_start is None or start < self._earliest_start:
                self._earliest_start = start
            applied = True
        if not applied:
            self.late_records_dropped += 1
        self._after(advanced)

    def punctuate_stream(self, stream_time: int) -> None:
        if self.emit.mode == "every" and self.emit.clock == "stream":
            self.emitter.punctuate(stream_time)
        self._close_windows(stream_time)

    def _close_windows(self, stream_time: int) -> None:
        if self._earliest_start is None or self._earliest_start + self.size + self.grace > stream_time:
            return
        # windows with start + size + grace <= stream_time, i.e. start < stream_time - size - grace + 1
        bound = window_key.start_bound(stream_time - self.size - self.grace + 1)
        closed = list(self.store.range(None, bound))
        final = self.emit.mode == "on_window_close"
        for wk, raw in closed:
            if final:
                self.emitter.window_closed(wk, raw[TS:], timestamped.timestamp_of(raw))
            else:
                self.emitter.emit_pending(wk)
            self.store.delete(wk)
            self.emitter.forget(wk)
        self.windows_closed += len(closed)
        nxt = next(iter(self.store.range(bound, None)), None)
        self._earliest_start = None if nxt is None else window_key.decode(nxt[0])[0]

    def metrics(self):
        return {**super().metrics(), "late_records_dropped": self.late_records_dropped,
                "windows_closed": self.windows_closed}
