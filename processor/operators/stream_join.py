"""Stream-stream windowed joins (inner, left, outer) and the stream self-join (KIP-862).

Kafka Streams (>= 3.1) semantics, record by record (``KStreamKStreamJoin``; the window stores'
retention as its segmented window stores apply it). NO record is dropped for lateness: a record
joins whatever the other side's window store still holds, and its own store may refuse it.

* A left record ``(k, v, t)`` matches right records of key ``k`` with timestamps in
  ``[t - before, t + after]``; a right record matches left records in ``[t - after, t + before]``.
  Records with a null key, a null value or a negative timestamp are dropped and counted
  (``skipped_null_key``, ``skipped_null_value``, ``skipped_invalid_timestamp``), except that a
  tracked side (below) forwards a record with a null key and a value at once as unmatched
  (KIP-962, Kafka Streams 3.7+). Every record with a valid timestamp advances stream time.
* Window stores (``<join>-this-store``: left records, ``<join>-other-store``: right records) have
  Kafka's retention ``R = before + after + grace``, by each store's OWN observed time (the
  largest timestamp put into it: a ``_bookkeeping`` entry ``stream_join_observed\x00<store>``).
  A record at ``t`` is in its store's live range while ``t > observed - R``: a record whose own
  store has already passed ``t + R`` is not stored (``expired_not_stored``) but still joins, and a
  scan of the other store sees only its live range (``lo = max(t - look_back, observed - R + 1)``).
  So with ``R == 0`` (``JoinWindows.of(0)``, no grace) nothing is ever matched, as in Kafka.
* Each side puts the record into its own store, then scans the OTHER side's store (one range
  scan, key then time then arrival order: ``processor/state/join_window_key.py``) and forwards
  ``joiner`` once per match, in store order, with timestamp ``max(t, other's t)`` (``joined``).
* Stream time is the largest timestamp the join has seen, from either side: ONE value in the
  ``_bookkeeping`` store (``stream_join_time\x00<join>``) that both side operators read and
  advance, committed with the state. It decides only the left/outer joins' unmatched records:
* Left/outer joins: a tracked record (left join: left records; outer: both) that found no match
  is forwarded at once as ``joiner(v, None)`` / ``joiner(None, v)`` with its own timestamp when
  its join window already ended (``t + look_ahead < stream time``: Kafka's "timeTo < stream
  time"), else it goes into the shared outer store; a later match from the other side removes
  it. When a record at ``t == stream time`` arrives, every stored record whose window closed
  (left: ``t + after + grace < stream time``, right: ``t + before + grace``) is forwarded with
  its own timestamp and deleted (``unmatched_emitted``), in Kafka Streams' outer-store order
  ``(timestamp, right before left, key bytes, arrival)``, BEFORE the arriving record is joined.
  A record emitted unmatched at once can still be matched later by a record within its window
  and grace (Kafka's spurious left/outer result for out-of-order input). Unlike Kafka, a closed
  record is not held back behind an earlier-timestamped one that is still open (asymmetric
  windows), Kafka's wall-clock throttle of these scans
  (``emit.interval.ms.kstreams.outer.join.spurious.results.fix``) does not apply. Unmatched
  records are not flushed at shutdown: they are state, and their windows close on stream time.
* Purging: entries outside their store's live range can never be seen again; they are deleted
  by a full scan of the join's window stores whenever stream time has advanced by half the
  retention since the last purge (``_bookkeeping``: ``stream_join_purged\x00<join>``); purging
  never changes the output.

The self-join (``StreamSelfJoin``) is the optimized form of ``s.join(s, ...)`` (pass
``self-join`` in ``topology.py``, rewrite in ``processor/dsl/stream_join.py``): ONE window store
for both sides. The unoptimized join runs each record ``r`` first on the left side (put into
this-store, scan other-store, which does not hold ``r`` yet: ``joiner(r, x)``), then on the
right side (put into other-store, scan this-store, which holds ``r``: ``joiner(x, r)``, ``r``
itself included). Both stores get every record in the same order, so they hold the same records
(their observed times and sequence counters advance in lockstep), and with windows where
``before == after`` one store ``S`` reproduces the output record for record: put ``r``; pass 1
scans ``S`` over ``[t - before, t + after]`` skipping ``r``, live range as the other store saw
it before ``r``: ``joiner(r, x)``; pass 2 the same range, live range after ``r``:
``joiner(x, r)``. Why only inner joins and only ``before == after``: see
``processor/dsl/stream_join.py``.
"""

from __future__ import annotations

import struct
from typing import Any

from processor.errors import SerializationError
from processor.operators.base import Processor
from processor.state import join_window_key as jwk
from processor.state import timestamped
from processor.state.store import BOOKKEEPING_STORE

HOWS = ("inner", "left", "outer")
TS = timestamped.TIMESTAMP_SIZE
_TIME = struct.Struct(">q")
_COUNTER = struct.Struct(">Q")


class _StreamJoin(Processor):
    """What both side operators and the self-join share: admission (null keys, stream time), the
    window stores' sequence counters and observed times (retention), scans and purging."""

    kind = "stream-join"

    def __init__(self, name, base, joiner, windows, key_serde):
        super().__init__(name)
        self.base = base
        self.joiner = joiner
        self.before, self.after, self.grace = windows.before_ms, windows.after_ms, windows.grace_ms
        self.retention = self.before + self.after + self.grace
        self.key_serde = key_serde
        tag = base.encode("utf-8")
        self._time_key = b"stream_join_time\x00" + tag
        self._purge_key = b"stream_join_purged\x00" + tag
        self.counts = dict.fromkeys(("records_in", "joined", "unmatched_emitted", "expired_not_stored",
                                     "skipped_null_key", "skipped_null_value", "skipped_invalid_timestamp",
                                     "purged"), 0)

    def init(self, context):
        super().init(context)
        self._task = context.get_store(BOOKKEEPING_STORE)

    # -- admission and stream time ---------------------------------------------------------------
    def _admit(self, key, value, ts):
        """The join's stream time after a record to join (advanced by it); None when it is dropped.
        Stream time advances before the null checks, as Kafka Streams' ``KStreamKStreamJoin``
        advances its shared time tracker for every record it is handed."""
        self.counts["records_in"] += 1
        if ts < 0:
            self.counts["skipped_invalid_timestamp"] += 1
            return None
        raw = self._task.get(self._time_key)
        stream_time = -1 if raw is None else _TIME.unpack(raw)[0]
        if ts > stream_time:
            stream_time = ts
            self._task.put(self._time_key, _TIME.pack(ts))
        if key is None:
            if value is not None and self._forwards_null_key():
                return None
            self.counts["skipped_null_key"] += 1
            return None
        if value is None:
            self.counts["skipped_null_value"] += 1
            return None
        return stream_time

    def _forwards_null_key(self) -> bool:
        """Whether a record with a null key and a value is joined with nothing at once (KIP-962:
        Kafka Streams' outer side of a left or outer join forwards it); it is forwarded by
        ``process``."""
        return False

    # -- window stores -----------------------------------------------------------------------------
    def _observed(self, store) -> int:
        """The largest timestamp put into ``store`` (-1: none yet)."""
        raw = self._task.get(b"stream_join_observed\x00" + store.name.encode("utf-8"))
        return -1 if raw is None else _TIME.unpack(raw)[0]

    def _append(self, store, kb, ts, vb) -> tuple[bytes, int]:
        """Put a record into its window store under the store's next sequence number, unless it
        is outside the store's live range (``ts <= observed - retention``, the observed time
        advanced by ``ts`` first): ``(window key, observed time before the put)``."""
        ck = b"stream_join_seq\x00" + store.name.encode("utf-8")
        raw = self._task.get(ck)
        seq = 0 if raw is None else _COUNTER.unpack(raw)[0]
        self._task.put(ck, _COUNTER.pack(seq + 1))
        wk = jwk.encode(kb, ts, seq)
        observed = self._observed(store)
        if ts > observed:
            self._task.put(b"stream_join_observed\x00" + store.name.encode("utf-8"), _TIME.pack(ts))
        if ts > max(observed, ts) - self.retention:
            store.put(wk, timestamped.encode(ts, vb))
        else:
            self.counts["expired_not_stored"] += 1
        return wk, observed

    @staticmethod
    def _scan(store, kb, lo_ts, hi_ts):
        """``[(window key, timestamp, value bytes)]`` of key ``kb`` in ``[lo_ts, hi_ts]``, store order."""
        return [(k, timestamped.timestamp_of(v), v[TS:]) for k, v in store.range(*jwk.time_range(kb, lo_ts, hi_ts))]

    def _purge(self, stream_time, stores) -> None:
        raw = self._task.get(self._purge_key)
        last = -1 if raw is None else _TIME.unpack(raw)[0]
        if stream_time - last < max(1, self.retention // 2):
            return
        self._task.put(self._purge_key, _TIME.pack(stream_time))
        for store in stores:
            cutoff = self._observed(store) - self.retention      # entries at or below: never seen again
            expired = [k for k, _ in store.items() if _TIME.unpack_from(k, len(k) - 12)[0] <= cutoff]
            for k in expired:
                store.delete(k)
            self.counts["purged"] += len(expired)

    # -- user functions and serdes --------------------------------------------------------------
    def _join(self, left, right):
        try:
            return self.joiner(left, right)
        except Exception as exc:
            raise self.user_error(self.joiner, exc) from exc

    def _serialize(self, serde, value, what) -> bytes:
        try:
            return serde.serialize(value)
        except Exception as exc:
            raise SerializationError(f"{what} serialization with {serde!r} for the join's window store "
                                     f"failed: {type(exc).__name__}: {exc}", step=self.name) from exc

    def metrics(self):
        return dict(self.counts)


class StreamJoinSide(_StreamJoin):
    """One side (``left``: KSTREAM-JOINTHIS, ``right``: KSTREAM-JOINOTHER) of a stream-stream join."""

    def __init__(self, name, base, side, how, joiner, windows, key_serde, this_store, other_store,
                 outer_store, this_value_serde, other_value_serde):
        super().__init__(name, base, joiner, windows, key_serde)
        if side not in ("left", "right"):
            raise ValueError("side must be 'left' or 'right'")
        if how not in HOWS:
            raise ValueError(f"how must be one of {HOWS}")
        if (how == "inner") != (outer_store is None):
            raise ValueError("left and outer joins need an outer store, inner joins none")
        self.left = side == "left"
        self.side, self.other_side = (jwk.LEFT, jwk.RIGHT) if self.left else (jwk.RIGHT, jwk.LEFT)
        # From this side: a record at t matches other records in [t - look_back, t + look_ahead];
        # its window closes at t + look_ahead + grace.
        self.look_back, self.look_ahead = (self.before, self.after) if self.left else (self.after, self.before)
        self.tracks_this = how == "outer" or (how == "left" and self.left)
        self.tracks_other = how == "outer" or (how == "left" and not self.left)
        self.store_names = (this_store, other_store, outer_store)
        self.this_value_serde = this_value_serde
        self.other_value_serde = other_value_serde

    def init(self, context):
        super().init(context)
        this, other, outer = self.store_names
        self.this = context.get_store(this)
        self.other = context.get_store(other)
        self.outer: Any = None if outer is None else context.get_store(outer)

    def _forwards_null_key(self) -> bool:
        return self.tracks_this

    def process(self, key, value, timestamp):
        stream_time = self._admit(key, value, timestamp)
        if stream_time is None:
            if key is None and value is not None and timestamp >= 0 and self.tracks_this:   # KIP-962
                self.counts["unmatched_emitted"] += 1
                self.forward(None, self._join(value, None) if self.left else self._join(None, value), timestamp)
            return
        if timestamp == stream_time and self.outer is not None:
            self._emit_closed(stream_time)
        kb = self._serialize(self.key_serde, key, "key")
        vb = self._serialize(self.this_value_serde, value, "value")
        wk, _ = self._append(self.this, kb, timestamp, vb)
        live_from = self._observed(self.other) - self.retention + 1
        matches = self._scan(self.other, kb, max(timestamp - self.look_back, live_from),
                             timestamp + self.look_ahead)
        for owk, ots, ovb in matches:
            if self.tracks_other:
                ok = jwk.outer_of(owk, self.other_side)
                if self.outer.get(ok) is not None:
                    self.outer.delete(ok)
            other = self.other_value_serde.deserialize(ovb)
            out = self._join(value, other) if self.left else self._join(other, value)
            self.counts["joined"] += 1
            self.forward(key, out, max(timestamp, ots))
        if not matches and self.tracks_this:
            if timestamp + self.look_ahead < stream_time:     # its window has ended: no waiting
                self.counts["unmatched_emitted"] += 1
                self.forward(key, self._join(value, None) if self.left else self._join(None, value), timestamp)
            else:
                self.outer.put(jwk.outer_of(wk, self.side), timestamped.encode(timestamp, vb))
        if timestamp == stream_time:
            self._purge(stream_time, (self.this, self.other))

    def _emit_closed(self, stream_time) -> None:
        """Forward and delete the unmatched records whose window closed before ``stream_time``."""
        close = {jwk.LEFT: self.after + self.grace, jwk.RIGHT: self.before + self.grace}
        bound = stream_time - min(close.values())
        if bound <= 0:
            return
        closed = []
        for ok, raw in self.outer.range(None, jwk.outer_before(bound)):
            ts, side, _, kb = jwk.decode_outer(ok)
            if ts + close[side] < stream_time:
                closed.append((ok, ts, side, kb, raw[TS:]))
        # Kafka Streams' order: its outer store's key is (timestamp, side: right 0 before left 1,
        # key bytes), each holding a list in arrival order; this store keeps (timestamp, side,
        # sequence, key), so the batch is sorted
        closed.sort(key=lambda c: (c[1], c[2] == jwk.LEFT, c[3], c[0]))
        for ok, ts, side, kb, vb in closed:
            self.outer.delete(ok)
            key = self.key_serde.deserialize(kb)
            mine = side == self.side
            v = (self.this_value_serde if mine else self.other_value_serde).deserialize(vb)
            out = self._join(v, None) if side == jwk.LEFT else self._join(None, v)
            self.counts["unmatched_emitted"] += 1
            self.forward(key, out, ts)


class StreamSelfJoin(_StreamJoin):
    """``s.join(s, joiner, windows)`` after the self-join rewrite: one window store, two passes
    per record (see the module docstring). Needs ``before == after``."""

    kind = "stream-self-join"

    def __init__(self, name, base, joiner, windows, key_serde, store, value_serde):
        super().__init__(name, base, joiner, windows, key_serde)
        if self.before != self.after:
            raise ValueError("a stream self-join over one store needs before == after")
        self.store_name = store
        self.value_serde = value_serde

    def init(self, context):
        super().init(context)
        self.store = context.get_store(self.store_name)

    def process(self, key, value, timestamp):
        stream_time = self._admit(key, value, timestamp)
        if stream_time is None:
            return
        kb = self._serialize(self.key_serde, key, "key")
        wk, observed = self._append(self.store, kb, timestamp, self._serialize(self.value_serde, value, "value"))
        # pass 1 sees the live range of the other store before r, pass 2 after r (see the docstring);
        # before == after: both passes scan [t - before, t + after]
        live_before = observed - self.retention + 1
        live_after = max(observed, timestamp) - self.retention + 1
        matches = self._scan(self.store, kb, max(timestamp - self.before, live_before), timestamp + self.after)
        for owk, ots, ovb in matches:          # pass 1: as the left side, before r is on the right
            if owk != wk:
                self.counts["joined"] += 1
                self.forward(key, self._join(value, self.value_serde.deserialize(ovb)), max(timestamp, ots))
        for _owk, ots, ovb in matches:          # pass 2: as the right side, r itself included
            if ots >= live_after:
                self.counts["joined"] += 1
                self.forward(key, self._join(self.value_serde.deserialize(ovb), value), max(timestamp, ots))
        if timestamp == stream_time:
            self._purge(stream_time, (self.store,))
