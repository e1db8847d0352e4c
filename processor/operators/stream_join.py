"""Stream-stream windowed joins (inner, left, outer) and the stream self-join (KIP-862).

Invariant: after each input record, the join has forwarded ``joiner(l, r)`` exactly once for
every pair of a left record ``l`` and a right record ``r`` that were admitted (not dropped) and
have equal keys and ``r.ts - before <= l.ts <= r.ts + after`` -- the pair is emitted when the
later of the two arrives, with timestamp ``max(l.ts, r.ts)``; and, for left/outer joins,
``joiner(v, None)`` / ``joiner(None, v)`` exactly once for every admitted record that had no
match when its window closed. Kafka Streams (>= 3.1) semantics, record by record:

* A left record ``(k, v, t)`` matches right records of key ``k`` with timestamps in
  ``[t - before, t + after]``; a right record matches left records in ``[t - after, t + before]``.
  Records with a null key, a null value or a negative timestamp are dropped and counted
  (``skipped_null_key``, ``skipped_null_value``, ``skipped_invalid_timestamp``), as Kafka does.
* Stream time is the largest timestamp the join has seen, from either side: ONE value in the
  ``_bookkeeping`` store (``stream_join_time\\x00<join>``) that both side operators read and advance,
  committed with the state. It advances first; then a left record is late when
  ``stream time > t + after + grace`` (right: ``t + before + grace``): it is dropped and counted
  (``late_records_dropped``), joins nothing and is never emitted as unmatched.
* Each side puts the record into its own window store, then scans the OTHER side's store
  (one range scan, key then time then arrival order: ``processor/state/join_window_key.py``)
  and forwards one result per match, in store order (``joined``).
* Left/outer joins: a tracked record (left join: left records; outer: both) that found no
  match goes into the shared outer store; a later match from the other side removes it. When a
  record advances stream time past a stored record's window close (left: ``t + after + grace``,
  right: ``t + before + grace``), that record is forwarded as ``joiner(v, None)`` (left) or
  ``joiner(None, v)`` (right) with its own timestamp and deleted (``unmatched_emitted``), in
  outer-store order ``(timestamp, side, sequence)``, BEFORE the advancing record is joined (it
  cannot match a closed record). Unlike Kafka, a closed record is not held back behind an
  earlier-timestamped one that is still open (asymmetric windows). Unmatched records are not
  flushed at shutdown: they are state, and their windows close on stream time (as Kafka).
* Retention: a record at ``t`` can never match again once ``stream time > t + before + after +
  grace`` (a matching record would be late). Such entries are purged by a full scan of the
  join's window stores whenever stream time has advanced by half the retention since the last
  purge (``_bookkeeping``: ``stream_join_purged\\x00<join>``); purging never changes the output.

The self-join (``StreamSelfJoin``) is the optimized form of ``s.join(s, ...)`` (pass
``self-join`` in ``topology.py``, rewrite in ``processor/dsl/stream_join.py``): ONE window store
for both sides. The unoptimized join runs each record ``r`` first on the left side (put into
this-store, scan other-store, which does not hold ``r`` yet: ``joiner(r, x)``), then on the
right side (put into other-store, scan this-store, which holds ``r``: ``joiner(x, r)``, ``r``
itself included). With windows where ``before == after`` both sides admit exactly the same
records, so both stores always hold the same records in the same order (their sequence
counters advance in lockstep) and one store ``S`` reproduces the output record for record:
put ``r``; pass 1 scans ``S`` over ``[t - before, t + after]`` skipping ``r``: ``joiner(r, x)``;
pass 2 scans it over ``[t - after, t + before]``: ``joiner(x, r)``. Why only inner joins and
only ``before == after``: see ``processor/dsl/stream_join.py``.
"""

from __future__ import annotations

import struct

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
    """What both side operators and the self-join share: admission (null keys, stream time,
    lateness), the window stores' sequence counters, scans and purging."""

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
        self.counts = dict.fromkeys(("records_in", "joined", "unmatched_emitted", "late_records_dropped",
                                     "skipped_null_key", "skipped_null_value", "skipped_invalid_timestamp",
                                     "purged"), 0)

    def init(self, context):
        super().init(context)
        self._task = context.get_store(BOOKKEEPING_STORE)

    # -- admission and stream time ---------------------------------------------------------------
    def _admit(self, key, value, ts, look_ahead):
        """``(advanced, stream time)`` for a record to join; None when it is dropped."""
        self.counts["records_in"] += 1
        if key is None:
            self.counts["skipped_null_key"] += 1
            return None
        if value is None:
            self.counts["skipped_null_value"] += 1
            return None
        if ts < 0:
            self.counts["skipped_invalid_timestamp"] += 1
            return None
        raw = self._task.get(self._time_key)
        stream_time = -1 if raw is None else _TIME.unpack(raw)[0]
        advanced = ts > stream_time
        if advanced:
            stream_time = ts
            self._task.put(self._time_key, _TIME.pack(ts))
        if stream_time > ts + look_ahead + self.grace:
            self.counts["late_records_dropped"] += 1
            return None
        return advanced, stream_time

    # -- window stores -----------------------------------------------------------------------------
    def _append(self, store, kb, ts, vb) -> bytes:
        """Put a record into a window store under the store's next sequence number."""
        ck = b"stream_join_seq\x00" + store.name.encode("utf-8")
        raw = self._task.get(ck)
        seq = 0 if raw is None else _COUNTER.unpack(raw)[0]
        self._task.put(ck, _COUNTER.pack(seq + 1))
        wk = jwk.encode(kb, ts, seq)
        store.put(wk, timestamped.encode(ts, vb))
        return wk

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
        cutoff = stream_time - self.retention
        for store in stores:
            expired = [k for k, _ in store.items() if _TIME.unpack_from(k, len(k) - 12)[0] < cutoff]
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
        self.outer = None if outer is None else context.get_store(outer)

    def process(self, key, value, timestamp):
        admitted = self._admit(key, value, timestamp, self.look_ahead)
        if admitted is None:
            return
        advanced, stream_time = admitted
        if advanced and self.outer is not None:
            self._emit_closed(stream_time)
        kb = self._serialize(self.key_serde, key, "key")
        vb = self._serialize(self.this_value_serde, value, "value")
        wk = self._append(self.this, kb, timestamp, vb)
        matches = self._scan(self.other, kb, timestamp - self.look_back, timestamp + self.look_ahead)
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
            self.outer.put(jwk.outer_of(wk, self.side), timestamped.encode(timestamp, vb))
        if advanced:
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
        admitted = self._admit(key, value, timestamp, self.after)
        if admitted is None:
            return
        advanced, stream_time = admitted
        kb = self._serialize(self.key_serde, key, "key")
        wk = self._append(self.store, kb, timestamp, self._serialize(self.value_serde, value, "value"))
        # before == after: pass 1's range [t - before, t + after] IS pass 2's [t - after, t + before]
        matches = self._scan(self.store, kb, timestamp - self.before, timestamp + self.after)
        for owk, ots, ovb in matches:          # pass 1: as the left side, before r is on the right
            if owk != wk:
                self.counts["joined"] += 1
                self.forward(key, self._join(value, self.value_serde.deserialize(ovb)), max(timestamp, ots))
        for owk, ots, ovb in matches:          # pass 2: as the right side, r itself included
            self.counts["joined"] += 1
            self.forward(key, self._join(self.value_serde.deserialize(ovb), value), max(timestamp, ots))
        if advanced:
            self._purge(stream_time, (self.store,))
