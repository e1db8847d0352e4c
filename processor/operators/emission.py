"""Emission control of one aggregate: the last-emitted column and the ``Emit`` policy.

Invariant: ``<store>.emitted`` holds, per key, exactly what was last forwarded for it (bytes,
the timestamp it carried, when it was emitted). A policy compares the key's current value bytes
with those bytes and never forwards a no-op (except ``Emit.on_update()``, the explicit opt-out).
Both columns live in the task's stores and are committed with the input offsets as one unit, so
a record replayed after a crash meets the last-emitted column as of the last commit and its
emission happens again: a crash can duplicate an emission, never lose one (the replay bug that
made Kafka Streams turn KIP-557's emit-on-change off).

Policies (see ``processor.dsl.emit``):
  ``on_update``        forward ``Change(new, last_emitted)`` for every update
  ``on_change``        forward when the bytes differ from the last-emitted bytes
  ``every(n, clock)``  at most one emission per key per ``n`` ms of ``clock``; a deferred key is
                       forwarded by the punctuator once its interval has passed, or by ``flush()``
  ``on_window_close``  nothing on update; the windowed aggregate calls ``window_closed``

Pending keys of ``every`` are kept in memory (a heap of deadlines) and rebuilt when the task
opens by comparing the two columns, so a key deferred before a crash is still emitted after it.
Counters: ``records_emitted``, ``noop_updates_skipped``, ``emissions_deferred``.

Compiled (docs/compiled.md), ``AggregateEmitter`` is a final extension type: its attributes are
C fields and an update's steps (``updated``, ``_emit``, ``_forward_change``) call each other as C
functions; pure Python runs the same code as a plain class.
"""

from __future__ import annotations

import heapq

import cython

from processor.records import Change
from processor.state import emitted as emitted_codec
from processor.state import timestamped
from processor.state.emitted import encode as _encode_emitted
from processor.state.emitted import value_of as _emitted_value

TS = timestamped.TIMESTAMP_SIZE


@cython.final
@cython.cclass
class AggregateEmitter:
    emit = cython.declare(object, visibility="public")
    context = cython.declare(object, visibility="public")
    send_old = cython.declare(cython.bint, visibility="public")
    mode = cython.declare(str, visibility="public")
    interval = cython.declare(object, visibility="public")
    store = cython.declare(object, visibility="public")
    emitted = cython.declare(object, visibility="public")
    value_serde = cython.declare(object, visibility="public")
    key_of = cython.declare(object, visibility="public")
    _forward = cython.declare(object)
    clock = cython.declare(object, visibility="public")
    records_emitted = cython.declare(cython.longlong, visibility="public")
    noop_updates_skipped = cython.declare(cython.longlong, visibility="public")
    emissions_deferred = cython.declare(cython.longlong, visibility="public")
    _pending = cython.declare(dict)
    _heap = cython.declare(list)

    def __init__(self, emit, store, emitted_store, value_serde, key_of, forward, clock, context=None,
                 send_old: bool = True):
        self.emit = emit
        # ``send_old`` False: no consumer reads ``Change.old`` (every child is a to_stream), so it
        # is not deserialized (None). ``context``: the task's, where an emission leaves its new
        # value's bytes for a sink that writes them unchanged (``Sink.passthrough``).
        self.context = context
        self.send_old = send_old
        self.mode = emit.mode
        self.interval = emit.interval_ms
        self.store = store
        self.emitted = emitted_store
        self.value_serde = value_serde
        self.key_of = key_of          # key bytes -> key object forwarded downstream
        self._forward = forward       # (key, Change, timestamp)
        self.clock = clock            # () -> now on the policy's clock
        self.records_emitted = 0
        self.noop_updates_skipped = 0
        self.emissions_deferred = 0
        self._pending = {}   # key -> (deadline, timestamp to carry)
        self._heap = []      # (deadline, key)
        if self.mode == "every":
            self._rebuild_pending()

    # -- updates ------------------------------------------------------------------------------
    @cython.ccall
    def updated(self, kb, new_bytes, record_ts, value_ts):
        """The store's value for ``kb`` is now ``new_bytes`` (None: deleted); ``value_ts`` is the
        timestamp of the value's last real change. ``on_update`` forwards with ``record_ts``
        (for a no-op update, the later of the record's and the value's), every other policy
        with ``value_ts``."""
        mode: str = self.mode
        if mode == "on_window_close":
            self.emissions_deferred += 1
            return
        em_raw = self.emitted.get(kb)
        em_bytes = None if em_raw is None else _emitted_value(em_raw)
        if mode == "on_update":
            self._emit(kb, new_bytes, em_bytes, record_ts, 0)
            return
        if new_bytes == em_bytes:
            self.noop_updates_skipped += 1
            if self._pending:
                self._pending.pop(kb, None)   # back to what was emitted: nothing pending
            return
        if mode == "on_change":
            self._emit(kb, new_bytes, em_bytes, value_ts, 0)
            return
        em = None if em_raw is None else emitted_codec.decode(em_raw)
        now = self.clock()
        if em is None or now - em.emitted_at >= self.interval:
            self._pending.pop(kb, None)
            self._emit(kb, new_bytes, em_bytes, value_ts, now)
        else:
            deadline = em.emitted_at + self.interval
            if kb not in self._pending:  # the deadline only moves when the key is emitted
                heapq.heappush(self._heap, (deadline, kb))
            self._pending[kb] = (deadline, value_ts)
            self.emissions_deferred += 1

    @cython.cfunc
    def _emit(self, kb, new_bytes, old_bytes, ts, now):
        if new_bytes is None:
            # No entry means "nothing emitted": a deleted key leaves no trace. (Under ``every``, a
            # key re-created within the interval after its tombstone is emitted at once.)
            self.emitted.delete(kb)
        else:
            self.emitted.put(kb, _encode_emitted(new_bytes, ts, now))
        self.records_emitted += 1
        old = None if old_bytes is None or not self.send_old else self.value_serde.deserialize(old_bytes)
        self._forward_change(kb, new_bytes, old, ts)

    @cython.cfunc
    def _forward_change(self, kb, new_bytes, old, ts):
        """Forward ``Change(new, old)``, the new value deserialized from ``new_bytes``; while it
        travels, the context names ``new_bytes`` as that object's bytes (a sink reached through
        value-preserving steps writes them as they are: they are the store's)."""
        new = None if new_bytes is None else self.value_serde.deserialize(new_bytes)
        ctx = self.context
        if ctx is None:
            self._forward(self.key_of(kb), Change(new, old), ts)
            return
        saved = ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde
        ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde = new, new_bytes, self.value_serde
        try:
            self._forward(self.key_of(kb), Change(new, old), ts)
        finally:
            ctx.source_value, ctx.source_value_bytes, ctx.source_value_serde = saved

    @cython.cfunc
    def _emit_current(self, kb, ts_if_deleted, now):
        """Forward ``kb``'s current value if it differs from its last emission."""
        cur = self.store.get(kb)
        em_raw = self.emitted.get(kb)
        em_bytes = None if em_raw is None else _emitted_value(em_raw)
        cur_bytes = None if cur is None else cur[TS:]
        if cur_bytes == em_bytes:
            return
        ts = ts_if_deleted if cur is None else timestamped.timestamp_of(cur)
        self._emit(kb, cur_bytes, em_bytes, ts, now)

    # -- closing-time control -------------------------------------------------------------------
    def punctuate(self, now: int) -> None:
        """Forward every deferred key whose interval has passed at ``now`` (policy clock)."""
        heap, pending = self._heap, self._pending
        while heap and heap[0][0] <= now:
            deadline, kb = heapq.heappop(heap)
            entry = pending.get(kb)
            if entry is None or entry[0] != deadline:
                continue  # emitted or re-scheduled since
            del pending[kb]
            self._emit_current(kb, entry[1], now)

    def flush(self) -> None:
        """Forward every deferred key now (graceful shutdown, partition revocation)."""
        if not self._pending:
            return
        now = self.clock()
        for kb in sorted(self._pending):
            self._emit_current(kb, self._pending[kb][1], now)
        self._pending.clear()
        self._heap.clear()

    def retract(self, kb: bytes, ts: int) -> None:
        """``kb``'s row is gone for good (a session merged into another): a tombstone now if a
        result was emitted for it (under every policy but ``on_window_close``, which emits only
        closed windows), and nothing left of it: neither its last-emitted entry nor a pending
        emission (found in review: under ``every`` a deferred tombstone was forgotten with the
        row, so the stale session was never retracted)."""
        if self.mode == "on_window_close":
            return
        self._pending.pop(kb, None)
        em_raw = self.emitted.get(kb)
        if em_raw is not None:
            self._emit(kb, None, emitted_codec.decode(em_raw).value, ts, self.clock())

    def forget(self, kb: bytes) -> None:
        """Drop ``kb``'s last-emitted entry and pending emission (its window was purged)."""
        if self.mode != "on_window_close":  # that policy never writes the column
            self.emitted.delete(kb)
        self._pending.pop(kb, None)

    def emit_pending(self, kb: bytes) -> None:
        """Forward ``kb`` now if it has a deferred emission (its window is about to close)."""
        entry = self._pending.pop(kb, None)
        if entry is not None:
            self._emit_current(kb, entry[1], self.clock())

    def window_closed(self, kb: bytes, value_bytes: bytes, ts: int) -> None:
        """``Emit.on_window_close``: forward the final value of a window, once."""
        self.records_emitted += 1
        self._forward_change(kb, value_bytes, None, ts)

    def _rebuild_pending(self) -> None:
        """After a restart: every key whose current value differs from its last emission is due
        at its last emission + interval (at once if it was never emitted)."""
        em = iter(self.emitted.items())
        cur = iter(self.store.items())
        e = next(em, None)
        c = next(cur, None)
        while e is not None or c is not None:
            if c is not None and (e is None or c[0] < e[0]):
                kb, cur_bytes, ts, em_entry = c[0], c[1][TS:], timestamped.timestamp_of(c[1]), None
                c = next(cur, None)
            elif e is not None and (c is None or e[0] < c[0]):
                kb, cur_bytes, ts, em_entry = e[0], None, None, emitted_codec.decode(e[1])
                e = next(em, None)
            else:
                assert c is not None and e is not None   # the same key in both columns
                kb, cur_bytes, ts = c[0], c[1][TS:], timestamped.timestamp_of(c[1])
                em_entry = emitted_codec.decode(e[1])
                c = next(cur, None)
                e = next(em, None)
            em_bytes = None if em_entry is None else em_entry.value
            if cur_bytes == em_bytes:
                continue
            deadline = 0 if em_entry is None else em_entry.emitted_at + self.interval
            if ts is None:
                assert em_entry is not None   # a key only the emitted column has
                ts = em_entry.timestamp
            self._pending[kb] = (deadline, ts)
            heapq.heappush(self._heap, (deadline, kb))

    def metrics(self) -> dict[str, int]:
        return {"records_emitted": self.records_emitted,
                "noop_updates_skipped": self.noop_updates_skipped,
                "emissions_deferred": self.emissions_deferred}
