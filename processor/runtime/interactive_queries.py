"""Interactive queries: read a running worker's stores (Kafka Streams' interactive queries).

``worker.store(name).get(key)`` and ``.prefix(p)`` from Python; ``GET /stores/<store>/<key>`` and
``GET /stores/<store>?prefix=...`` over HTTP (``processor/runtime/http_endpoint.py``).

Invariants:
- A query is answered by the main loop, between two batches (``StoreQueries.serve``): a store is
  only ever read by the thread that writes it, and a query sees what the task itself would
  read (the unit's pending writes included, as Kafka Streams' caching stores do).
- A key is looked up only in the task that owns it: the partition its sub-topology's input
  topics put it in (their partitioners, as the worker checks them). A key owned by a task this
  worker does not run raises ``KeyNotHosted`` naming the partition and task (HTTP 404); one
  whose task is being restored raises ``StoreNotReady`` (HTTP 503).
- Values come back decoded with the topology's serdes, as ``processor state dump`` prints them
  (``{"key", "value", "timestamp"}``); only key-value stores (tables, aggregates, Processor
  API stores) are queryable, and global tables' stores, which every worker holds whole (any key
  is answered here, ``"task": "global"``, ``"partition": null``).
- A Processor API window or session store answers a key with every live window (session) of
  it: ``{"key", "windows": [{"window_start", "window_end", ("seq",) "value", "timestamp"}...]}``
  (``session_start``/``session_end``), in time order, expired ones left out as the store's own
  fetches leave them (``processor/papi_windowed.py``); no entry when it has none. A prefix scan
  of one is refused (``QueryError``, 400): its keys are windows, not the user's keys.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from processor.errors import ProcessorError
from processor.runtime.state_inspect import decode_entry

if TYPE_CHECKING:
    from processor.runtime.worker import Worker

QUERYABLE_KINDS = ("kv", "aggregate", "window", "session")
WINDOWED_KINDS = ("window", "session")
GLOBAL_TASK = "global"   # the "task" of a global table's entries (every worker holds all of it)
# a prefix scan returns at most this many entries unless asked for fewer
DEFAULT_LIMIT = 1000


class QueryError(ProcessorError):
    http_status = 400


class NoSuchStore(QueryError):
    http_status = 404


class KeyNotHosted(QueryError):
    """The key's partition is owned by a task this worker does not run."""
    http_status = 404

    def __init__(self, message: str, partition: int, task: str):
        super().__init__(message)
        self.partition = partition
        self.task = task


class StoreNotReady(QueryError):
    http_status = 503


class StoreQueries:
    """The queue between querying threads and the main loop."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.loop_thread: threading.Thread | None = None   # set by the worker's run()

    def pending(self) -> bool:
        return not self._queue.empty()

    def _waiting(self) -> Iterator[tuple[Callable[[], Any], Future]]:
        """The queries waiting, taken off the queue one by one until it is empty."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return

    def serve(self) -> None:
        """Main loop: answer every query waiting."""
        for fn, fut in self._waiting():
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def fail_waiting(self) -> None:
        """The loop stopped: every query still waiting gets ``StoreNotReady``."""
        for _, fut in self._waiting():
            if fut.set_running_or_notify_cancel():
                fut.set_exception(StoreNotReady("the worker is not running"))

    def call(self, fn, timeout_s: float = 10.0):
        """Run ``fn`` on the main loop (at once when called from it) and return its result."""
        if threading.current_thread() is self.loop_thread or self.loop_thread is None:
            if self.loop_thread is None:
                raise StoreNotReady("the worker is not running")
            return fn()
        fut: Future = Future()
        self._queue.put((fn, fut))
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            fut.cancel()
            raise StoreNotReady(f"the worker's main loop did not answer within {timeout_s:.0f} s") from None


class StoreView:
    """``worker.store(name)``: reads of one store across this worker's tasks."""

    def __init__(self, worker: Worker, name: str) -> None:
        topo = worker.topology
        spec = topo.stores.get(name) or topo.global_stores.get(name)
        queryable = sorted([n for n, s in topo.stores.items() if s.kind in QUERYABLE_KINDS] + list(topo.global_stores))
        if spec is None or spec.kind not in QUERYABLE_KINDS:
            raise NoSuchStore(f"no queryable store named {name!r} (queryable stores: {queryable})")
        self.worker = worker
        self.name = name
        self.spec = spec
        # a global table's store: every key is here (``GLOBAL_TASK``), no partition owns it
        self.is_global = name in topo.global_stores
        self.windowed = spec.kind in WINDOWED_KINDS
        # the serde of the keys a caller gives (a window/session store's keys are windows of them)
        self.key_serde = spec.key_serde.inner if self.windowed else spec.key_serde
        self.sub = None if self.is_global else next(
            s for s in sorted(set(worker._sub_of_topic.values())) if any(x.name == name for x in topo.stores_of(s)))

    # -- what a caller uses ----------------------------------------------------------------
    def get(self, key):
        """The value for ``key`` (None: no row); ``KeyNotHosted`` if another worker owns it."""
        entry = self.entry(key)
        return None if entry is None else entry["value"]

    def entry(self, key, timeout_s: float = 10.0) -> dict | None:
        """``{"key", "value", "timestamp", "partition", "task"}`` for ``key``, or None."""
        # (serialized by the main loop too: a serde may keep client state)
        return self.worker._queries.call(lambda: self._lookup(self.key_serde.serialize(key)), timeout_s)

    def prefix(self, prefix, limit: int = DEFAULT_LIMIT, timeout_s: float = 10.0) -> list[dict]:
        """Entries whose key bytes start with ``prefix``'s (a ``str`` is taken as UTF-8, ``bytes``
        as they are), over every task of this store this worker runs, in key order per task."""
        if self.windowed:
            raise QueryError(f"store {self.name!r} is a {self.spec.kind} store: it answers a key "
                             f"(/stores/{self.name}/<key>: every live window of it), not a prefix scan")
        pb = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        return self.worker._queries.call(lambda: self._scan(pb, limit), timeout_s)

    # -- main loop -------------------------------------------------------------------------
    def _global_store(self):
        tables = self.worker.global_tables
        if tables is None:
            raise StoreNotReady(f"global store {self.name!r}: the global tables are not bootstrapped yet")
        return tables.stores[self.name]

    def owner_partition(self, kb: bytes) -> int | None:
        if self.is_global:
            return None
        return self._partition_of(kb)

    def _partition_of(self, kb: bytes) -> int:
        """The partition of a key of a task store (not a global one)."""
        w = self.worker
        # the user topics first: foreign-key subscription and response topics follow their
        # readers' partitioning, not the internal partitioner routing names for them
        topics = sorted((t in w._internal_topics, t) for t, s in w._sub_of_topic.items() if s == self.sub)
        for _, t in topics:
            p = w.routing.partitioner_of(t)
            if p.places(kb):
                return p.partition(kb, w._parts[t])
        raise QueryError(f"store {self.name!r}: no input topic of its sub-topology places key {kb!r}")

    def _lookup(self, kb: bytes) -> dict | None:
        w = self.worker
        if self.is_global:
            raw = self._global_store().get(kb)
            return None if raw is None else {**decode_entry(self.spec, kb, raw), "partition": None,
                                             "task": GLOBAL_TASK}
        sub = self.sub
        assert sub is not None   # a task store's view (a global one returned above)
        part = self._partition_of(kb)
        task_id = f"{sub}_{part}"
        task = w.tasks.get((sub, part))
        if task is None:
            if any((sub, part) in r.keys for r in w._restoring):
                raise StoreNotReady(f"store {self.name!r}: task {task_id} (partition {part}) is being restored")
            raise KeyNotHosted(f"store {self.name!r}: the key belongs to partition {part} (task {task_id}), "
                               f"which this worker does not run", part, task_id)
        if self.windowed:
            return self._windows(task, kb, part, task_id)
        raw = task.stores.store(self.name).get(kb)
        if raw is None:
            return None
        return {**decode_entry(self.spec, kb, raw), "partition": part, "task": task_id}

    def _windows(self, task, kb: bytes, part: int, task_id: str) -> dict | None:
        from processor import papi_windowed
        from processor.state.store import BOOKKEEPING_STORE

        cls = papi_windowed.WindowStore if self.spec.kind == "window" else papi_windowed.SessionStore
        view = cls(self.name, task.stores.store(self.name), task.stores.store(BOOKKEEPING_STORE),
                   self.spec.key_serde, self.spec.value_serde, lambda: 0)
        windows = []
        for k, v in view.live_entries(kb):
            e = decode_entry(self.spec, k, v)
            del e["key"]
            windows.append(e)
        if not windows:
            return None
        return {"key": self.key_serde.deserialize(kb), "windows": windows, "partition": part, "task": task_id}

    def _scan(self, pb: bytes, limit: int) -> list[dict]:
        w = self.worker
        out: list[dict] = []
        if self.is_global:
            for k, v in self._global_store().prefix(pb):
                if v is None:
                    continue
                if len(out) >= limit:
                    break
                out.append({**decode_entry(self.spec, k, v), "partition": None, "task": GLOBAL_TASK})
            return out
        for (sub, part), task in sorted(w.tasks.items()):
            if sub != self.sub:
                continue
            for k, v in task.stores.store(self.name).prefix(pb):
                if v is None:
                    continue
                if len(out) >= limit:
                    return out
                out.append({**decode_entry(self.spec, k, v), "partition": part, "task": task.id})
        return out
