"""``KStream.process(P, stores=[...])``: a user ``processor.papi.Processor`` hosted as an operator.

Invariant: one user instance per task (``P`` a class or a zero-argument factory), initialised
with a ``papi.ProcessorContext`` after the task's stores are open, closed with the task. Each
input record reaches ``process(Record)`` with its key, value, timestamp, headers and
provenance; what the user forwards goes to the children with the forwarded record's timestamp
and headers. Stream-time punctuations run on the task's stream time (the largest timestamp of
the task's input records: ``Task.process`` calls ``punctuate_task_time`` after a record that
advanced it, whether or not the record reached this processor); each stream schedule's next time
is kept in the task's bookkeeping (``punctuate\\x00<operator>\\x00<index>``), each wall
schedule's in the task's context, so neither a restored task (stream) nor operators rebuilt after
a failed record (both) start them again; punctuations follow ``papi``'s rules. A user function
that raises is a ``UserFunctionError`` naming the step and the function.
"""

from __future__ import annotations

import struct
from typing import Any

from processor import papi
from processor.errors import ProcessingError, TopologyError
from processor.operators import replay as replay_semantics
from processor.operators.base import Processor, describe_function
from processor.records import Record
from processor.state.store import BOOKKEEPING_STORE

_TIME = struct.Struct(">q")
# the user instances hosted now, by id: a factory must make a new one per task
_IN_USE: dict[int, object] = {}


class _Schedule:
    __slots__ = ("interval", "callback", "next", "handle")

    def __init__(self, interval, callback, first, on_cancel):
        self.interval, self.callback, self.next = interval, callback, first
        self.handle = papi.Cancellable(on_cancel)

    def advance(self, now: int) -> None:
        """The next time after a punctuation at ``now`` (missed intervals skipped)."""
        nxt = self.next + self.interval
        if now >= nxt:
            nxt = self.next + ((now - self.next) // self.interval + 1) * self.interval
        self.next = nxt


class UserProcessor(Processor):
    kind = "user-processor"
    replay = replay_semantics.USER_PROCESSOR

    def __init__(self, name, factory, stores: dict, read_only: dict | None = None):
        super().__init__(name)
        self.factory = factory
        self.store_specs = stores          # {name: StoreSpec} this processor may use
        # DSL tables' stores it may only read: {store name: the node that writes it}
        self.read_only = read_only or {}
        self.user: Any = None    # the user's processor (made by init)
        self._stream_schedules: list[_Schedule] = []
        self._wall_schedules: list[_Schedule] = []
        self._stores: dict = {}
        self._ts = 0                        # the timestamp of what is being processed
        self.punctuations = 0

    # the task calls punctuate_wall only on operators that say so; a user may schedule one at any time
    punctuates_wall = True
    punctuates_task_time = True
    closes_on_rebuild = True

    @property
    def observed_time(self) -> int:
        """The task's stream time (``ProcessorContext.current_stream_time_ms``)."""
        return self.context.stream_time

    def init(self, context):
        super().init(context)
        self._bookkeeping = context.get_store(BOOKKEEPING_STORE)
        try:
            self.user = self.factory()
        except Exception as exc:
            raise self.user_error(self.factory, exc) from exc
        if not isinstance(self.user, papi.Processor) and not callable(getattr(self.user, "process", None)):
            raise TopologyError(f"{self.name}: process() needs a processor.Processor (or a factory of one), "
                                f"got {self.user!r}")
        if id(self.user) in _IN_USE:
            user, self.user = self.user, None
            raise TopologyError(f"{self.name}: the factory returned {user!r}, which another task already uses; "
                                f"process() needs a new instance per task (as Kafka Streams' ProcessorSupplier)")
        try:
            self.user.init(papi.ProcessorContext(self))
        except Exception as exc:
            raise self.user_error(self.user.init, exc) from exc
        _IN_USE[id(self.user)] = self.user   # (held: its id is not reused while it is here)

    # -- what papi.ProcessorContext calls -------------------------------------------------------
    def user_store(self, name: str):
        s = self._stores.get(name)
        if s is None:
            spec = self.store_specs.get(name)
            if spec is None:
                raise TopologyError(f"{self.name}: store {name!r} is not connected to this processor "
                                    f"(process(..., stores=[...]) names {sorted(self.store_specs)})")
            if spec.kind in ("window", "session"):   # processor/papi_windowed.py
                from processor import papi_windowed

                cls = papi_windowed.WindowStore if spec.kind == "window" else papi_windowed.SessionStore
                s = self._stores[name] = cls(name, self.context.get_store(name), self._bookkeeping,
                                             spec.key_serde, spec.value_serde, lambda: self._ts)
                return s
            if name in self.read_only:        # a DSL table's store: its operator alone writes it
                s = self._stores[name] = papi.ReadOnlyKeyValueStore(
                    name, self.context.get_store(name), spec.key_serde, spec.value_serde, lambda: self._ts,
                    step=self.name, owner=self.read_only[name])
                return s
            s = self._stores[name] = papi.KeyValueStore(name, self.context.get_store(name), spec.key_serde,
                                                        spec.value_serde, lambda: self._ts)
        return s

    def forward_record(self, record: Record) -> None:
        ctx = self.context
        headers = ctx.headers
        given = tuple(record.headers) if record.headers else ()
        if given != tuple(headers or ()):
            ctx.headers = list(given) or None
        try:
            self.forward(record.key, record.value, record.timestamp)
        finally:
            ctx.headers = headers

    def schedule(self, interval_ms: int, punctuation_type: str, callback) -> papi.Cancellable:
        if not isinstance(interval_ms, int) or interval_ms < 1:
            raise TopologyError(f"{self.name}: schedule() takes an interval of at least 1 ms, not {interval_ms!r}")
        if punctuation_type == "stream":
            # aligned to 0: the first at the first record; a schedule made again (a restored
            # task, operators rebuilt after a failed record) goes on from where it was, or stays
            # cancelled (next time -1)
            key = self._schedule_key(len(self._stream_schedules))
            raw = self._bookkeeping.get(key)
            first = 0 if raw is None else _TIME.unpack(raw)[0]
            s = _Schedule(interval_ms, callback, first,
                          lambda: self._bookkeeping.put(key, _TIME.pack(-1)))
            s.handle.cancelled = first == -1
            self._stream_schedules.append(s)
        elif punctuation_type == "wall":
            # the first after one interval; made again after a rebuild, from where it was
            wall_key = (self.name, len(self._wall_schedules))
            kept = self.context.wall_schedules
            first = kept.setdefault(wall_key, self.context.wall_clock() + interval_ms)
            s = _Schedule(interval_ms, callback, -1 if first is None else first,
                          lambda: kept.__setitem__(wall_key, None))
            s.handle.cancelled = first is None
            self._wall_schedules.append(s)
        else:
            raise TopologyError(f"{self.name}: schedule() takes 'stream' or 'wall', not {punctuation_type!r}")
        return s.handle

    # -- the operator -------------------------------------------------------------------------
    def _schedule_key(self, i: int) -> bytes:
        return b"punctuate\x00" + self.name.encode("utf-8") + b"\x00" + str(i).encode()

    def process(self, key, value, timestamp):
        ctx = self.context
        self._ts = timestamp
        rec = Record(key, value, timestamp, tuple(ctx.headers or ()), ctx.topic, ctx.partition, ctx.offset)
        try:
            self.user.process(rec)
        except Exception as exc:
            raise self.user_error(self.user.process, exc) from exc

    def punctuate_task_time(self, stream_time: int) -> None:
        if self._stream_schedules:
            self._punctuate(self._stream_schedules, stream_time, stream=True)

    def _punctuate(self, schedules, now: int, stream: bool = False) -> None:
        for i, s in enumerate(list(schedules)):
            if s.handle.cancelled or now < s.next:
                continue
            self._ts = now
            try:
                s.callback(now)
            except Exception as exc:
                # a punctuation is not the record's doing: fatal, never a dead-lettered record
                # (a wall-clock one fails outside any record anyway)
                raise ProcessingError(f"{'stream' if stream else 'wall'}-time punctuation "
                                      f"{describe_function(s.callback)} raised {type(exc).__name__}: {exc}",
                                      step=self.name) from exc
            self.punctuations += 1
            if s.handle.cancelled:    # (by its own callback: on_cancel kept that)
                continue
            s.advance(now)
            if stream:
                self._bookkeeping.put(self._schedule_key(i), _TIME.pack(s.next))
            else:
                self.context.wall_schedules[(self.name, i)] = s.next

    def punctuate_wall(self, now_ms: int) -> None:
        if self._wall_schedules:
            self._punctuate(self._wall_schedules, now_ms)

    def close(self) -> None:
        if self.user is not None:
            try:
                self.user.close()
            finally:
                _IN_USE.pop(id(self.user), None)
                self.user = None

    def metrics(self):
        out = {"punctuations": self.punctuations}
        dropped = sum(getattr(s, "expired_puts_dropped", 0) for s in self._stores.values())
        if dropped:
            out["expired_puts_dropped"] = dropped
        return out
