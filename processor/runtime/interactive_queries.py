"""Interactive queries: read a running worker's stores (Kafka Streams' interactive queries).

``worker.store(name).get(key)`` and ``.prefix(p)`` from Python; ``GET /stores/<store>/<key>`` and
``GET /stores/<store>?prefix=...`` over HTTP (``processor/runtime/http_endpoint.py``).

Invariants:
- A query is answered by the main loop, between two batches (``StoreQueries.serve``): a store is
  only ever read by the thread that writes it, and a query sees what the task itself would
  read (the unit's pending writes included, as Kafka Streams' caching stores do).
- The main loop gives queries at most ``SERVE_BUDGET_S`` per iteration (plus one slice): a
  prefix scan is read in slices of ``SCAN_SLICE`` entries, each slice a fresh range read that
  starts after the last key of the one before (no iterator is kept between two iterations, when
  the task may have committed, or moved), and a scan not finished goes to the back of the queue.
  So a scan is not a snapshot: each slice is read as of its iteration. At most ``MAX_WAITING``
  queries wait at once; one more is refused (``QueryBusy``, 503).
- A scan's page ends after at most ``limit`` entries, in partition order and key order within a
  partition; ``ScanPage.next`` (``Cursor``: the partition and the last key read, exclusive) is
  where the next page starts, None when nothing follows.
- A key is looked up only in the task that owns it: the partition its sub-topology's input
  topics put it in (their partitioners, as the worker checks them). A key owned by a task this
  worker does not run raises ``KeyNotHosted`` naming the partition and task (HTTP 404, or
  forwarded to the task's worker in a fleet); one whose task is being restored raises
  ``StoreNotReady`` (HTTP 503).
- Values come back decoded with the topology's serdes, as ``processor state dump`` prints them
  (``{"key", "value", "timestamp"}``); only key-value stores (tables, aggregates, Processor
  API stores) are queryable, and global tables' stores, which every worker holds whole (any key
  is answered here, ``"task": "global"``, ``"partition": null``).
- A Processor API window or session store answers a key with every live window (session) of
  it: ``{"key", "windows": [{"window_start", "window_end", ("seq",) "value", "timestamp"}...]}``
  (``session_start``/``session_end``), in time order, expired ones left out as the store's own
  fetches leave them (``processor/papi_windowed.py``); no entry when it has none. A prefix scan
  of one is refused (``QueryError``, 400): its keys are windows, not the user's keys.
- Who holds a key is decided in one place, ``StoreView.metadata`` (``worker.metadata_for_key``,
  Kafka Streams' ``queryMetadataForKey``): the key's partition as a lookup computes it, and the
  servers the group's latest assignment (``worker.fleet_map``) names for its task, as active and
  as standbys. A global store's keys are on every worker: ``active`` is this worker's server
  (the one asked answers, as in Kafka Streams), ``standbys`` every other server. The Python
  API never forwards: ``worker.store(name).get(key)`` reads this worker's tasks only, and a
  Python caller that wants any key asks ``metadata_for_key`` which worker to query (over HTTP,
  ``GET /stores/...`` on any worker forwards; ``processor/runtime/http_endpoint.py``).
- A stale read (``entry(key, stale=True)``) of a key whose task this worker keeps a standby
  replica of (and does not run) reads the standby's database as of its last commit (the
  writes a pass under way keeps pending are never seen), and says so (``"stale": true``).
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from processor.engine.task_id import TaskId
from processor.errors import ProcessorError
from processor.runtime.state_inspect import decode_entry
from processor.state.store import prefix_upper_bound

if TYPE_CHECKING:
    from processor.engine.routing import Routing
    from processor.engine.task import Task
    from processor.runtime.global_tables import GlobalTables
    from processor.runtime.standby import StandbyTasks
    from processor.runtime.task_manager import TaskManager
    from processor.topology.core import Topology

QUERYABLE_KINDS = ("kv", "aggregate", "window", "session")
WINDOWED_KINDS = ("window", "session")
GLOBAL_TASK = "global"   # the "task" of a global table's entries (every worker holds all of it)
# a prefix scan returns at most this many entries unless asked for fewer
DEFAULT_LIMIT = 1000
# over HTTP, a page never has more (a larger limit is cut to it; ``next`` continues)
MAX_LIMIT = 10_000
# the main loop's time for queries per iteration, and the entries a scan reads per slice
SERVE_BUDGET_S = 0.02
SCAN_SLICE = 256
# queries waiting for the main loop at most; one more is refused (503)
MAX_WAITING = 64
# how long a caller waits for a scan (read in slices while the loop processes records)
SCAN_TIMEOUT_S = 30.0


class QueryHost(Protocol):
    """What the queries read of a running worker (``processor/runtime/worker.py``), and nothing
    else: its tasks, standbys and global tables, how its topics are partitioned, and the fleet's
    map. ``fleet_map`` is replaced whole by the group's thread; the rest is read on the main loop
    (``StoreQueries``) or, for the map and the routing, from any thread."""

    topology: Topology
    task_manager: TaskManager
    global_tables: GlobalTables | None
    routing: Routing
    partition_counts: dict[str, int]
    internal_topics: set[str]
    application_server: str | None
    fleet_map: dict[str, dict[str, list[tuple[int, int]]]]
    queries: StoreQueries

    @property
    def tasks(self) -> dict[tuple[int, int], Task]: ...

    @property
    def standby_tasks(self) -> StandbyTasks | None: ...


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


class QueryBusy(StoreNotReady):
    """``MAX_WAITING`` queries already wait for the main loop: ask again."""


@dataclass(frozen=True)
class Cursor:
    """Where a scan's next page starts: after ``key`` (exclusive) in ``partition`` (None: a
    global store), then the next partitions from their first key. ``str()`` is its text
    (``?after=``): ``<partition or g>.<the key bytes, base64url>``."""

    partition: int | None
    key: bytes

    def __str__(self) -> str:
        p = "g" if self.partition is None else str(self.partition)
        return f"{p}.{base64.urlsafe_b64encode(self.key).decode().rstrip('=')}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        p, dot, k = text.partition(".")
        try:
            if not dot or not (p == "g" or (p.isdigit() and len(p) < 7)):
                raise ValueError
            key = base64.b64decode(k + "=" * (-len(k) % 4), altchars=b"-_", validate=True)
        except ValueError:
            raise QueryError(f"after={text[:80]!r} is not a cursor (the \"next\" of a previous page)") from None
        return cls(None if p == "g" else int(p), key)

    def position(self) -> tuple[int, bytes]:
        return (-1 if self.partition is None else self.partition, self.key)


@dataclass
class ScanPage:
    """One page of a prefix scan on this worker: the entries, the cursor of each (parallel to
    them), the partitions of this worker's tasks it covers (every partition of the store whose
    task runs here and stayed here while it was read) and where the next page starts (None: the
    scan ended)."""

    entries: list[dict] = field(default_factory=list)
    cursors: list[Cursor] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    next: Cursor | None = None


@dataclass(frozen=True)
class KeyQueryMetadata:
    """Where a key of a store lives (Kafka Streams' ``KeyQueryMetadata``): the application
    server (``host:port``) running its task as active (None: no member of the latest assignment
    does), those keeping standby replicas of it (sorted), its partition (None: a global store)
    and its task (``"<sub>_<partition>"`` or ``"global"``)."""

    active: str | None
    standbys: list[str]
    partition: int | None
    task: str


def task_holders(fleet_map: Mapping[str, Mapping[str, list]], task: tuple[int, int]) -> tuple[str | None, list[str]]:
    """``(active server or None, sorted standby servers)`` of ``task`` in a fleet map
    (``{server: {"active": [task keys], "standby": [task keys]}}``). An assignment names one
    active per task; should two servers claim it, the first in sorted order is taken."""
    def holding(role: str) -> list[str]:
        return sorted(s for s, tasks in fleet_map.items() if task in {tuple(t) for t in tasks.get(role, ())})

    actives = holding("active")
    return (actives[0] if actives else None), holding("standby")


class _Query:
    """A query waiting for the main loop: ``fn()`` is its answer, or with ``steps`` a generator
    that yields between slices and returns the answer."""

    __slots__ = ("fn", "fut", "steps", "gen", "abandoned")

    def __init__(self, fn: Callable[[], Any], steps: bool) -> None:
        self.fn = fn
        self.fut: Future = Future()
        self.steps = steps
        self.gen: Generator[None, None, Any] | None = None
        self.abandoned = False


class StoreQueries:
    """The queue between querying threads and the main loop."""

    def __init__(self, worker: QueryHost) -> None:
        self.worker = worker
        self._queue: queue.SimpleQueue[_Query] = queue.SimpleQueue()
        self.loop_thread: threading.Thread | None = None   # set by the worker's run()

    def pending(self) -> bool:
        return not self._queue.empty()

    def _waiting(self) -> Iterator[_Query]:
        """The queries waiting, taken off the queue one by one until it is empty."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return

    def serve(self, budget_s: float = SERVE_BUDGET_S) -> None:
        """Main loop: answer the queries waiting, for ``budget_s`` (and one query or slice more);
        the rest, and scans not finished, wait for the next iteration (the module's invariants)."""
        deadline = time.monotonic() + budget_s
        unfinished = []
        for q in self._waiting():
            fut = q.fut
            if q.gen is None:
                if q.abandoned or not fut.set_running_or_notify_cancel():
                    continue
                if not q.steps:
                    try:
                        fut.set_result(q.fn())
                    except BaseException as exc:
                        fut.set_exception(exc)
                    if time.monotonic() >= deadline:
                        break
                    continue
            elif q.abandoned:   # (its caller stopped waiting)
                fut.set_exception(StoreNotReady("abandoned"))
                continue
            try:
                if q.gen is None:
                    q.gen = q.fn()
                next(q.gen)
                unfinished.append(q)
            except StopIteration as done:
                fut.set_result(done.value)
            except BaseException as exc:
                fut.set_exception(exc)
            if time.monotonic() >= deadline:
                break
        for q in unfinished:   # to the back of the queue
            self._queue.put(q)

    def fail_waiting(self) -> None:
        """The loop stopped: every query still waiting gets ``StoreNotReady``."""
        for q in self._waiting():
            if q.gen is not None or q.fut.set_running_or_notify_cancel():
                q.fut.set_exception(StoreNotReady("the worker is not running"))

    def call(self, fn, timeout_s: float = 10.0):
        """Run ``fn`` on the main loop (at once when called from it) and return its result."""
        return self._call(fn, False, timeout_s)

    def call_steps(self, gen_fn: Callable[[], Generator[None, None, Any]], timeout_s: float = SCAN_TIMEOUT_S):
        """Run the generator ``gen_fn()`` on the main loop, a slice per ``next`` (the module's
        invariants), and return what it returns."""
        return self._call(gen_fn, True, timeout_s)

    def _call(self, fn, steps: bool, timeout_s: float):
        if threading.current_thread() is self.loop_thread or self.loop_thread is None:
            if self.loop_thread is None:
                raise StoreNotReady("the worker is not running")
            if not steps:
                return fn()
            gen = fn()
            while True:
                try:
                    next(gen)
                except StopIteration as done:
                    return done.value
        if self._queue.qsize() >= MAX_WAITING:
            raise QueryBusy(f"{MAX_WAITING} queries already wait for the worker's main loop: ask again")
        q = _Query(fn, steps)
        self._queue.put(q)
        try:
            return q.fut.result(timeout_s)
        except TimeoutError:
            q.abandoned = True
            q.fut.cancel()
            raise StoreNotReady(f"the worker's main loop did not answer within {timeout_s:.0f} s") from None


class StoreView:
    """``worker.store(name)``: reads of one store across this worker's tasks."""

    def __init__(self, worker: QueryHost, name: str) -> None:
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
            s for s in sorted(set(worker.task_manager.sub_of_topic.values()))
            if any(x.name == name for x in topo.stores_of(s)))

    # -- what a caller uses ----------------------------------------------------------------
    def get(self, key):
        """The value for ``key`` (None: no row); ``KeyNotHosted`` if another worker owns it."""
        entry = self.entry(key)
        return None if entry is None else entry["value"]

    def entry(self, key, timeout_s: float = 10.0, stale: bool = False) -> dict | None:
        """``{"key", "value", "timestamp", "partition", "task"}`` for ``key``, or None; with
        ``stale``, read from a standby replica when this worker keeps one of the key's task and
        does not run it (``"stale": True`` added)."""
        return self.lookup(key, timeout_s, stale)[0]

    def lookup(self, key, timeout_s: float = 10.0, stale: bool = False) -> tuple[dict | None, dict]:
        """``(entry or None, {"partition", "task"(, "stale")})``: ``entry``, and where it was read."""
        # (serialized by the main loop too: a serde may keep client state)
        return self.worker.queries.call(lambda: self._lookup(self.key_serde.serialize(key), stale), timeout_s)

    def metadata(self, key, timeout_s: float = 10.0) -> KeyQueryMetadata:
        """Which servers hold ``key`` (see the module docstring); ``worker.fleet_map`` is read
        as one object (the worker replaces it whole at each assignment)."""
        part = self.worker.queries.call(lambda: self.owner_partition(self.key_serde.serialize(key)), timeout_s)
        fleet_map = self.worker.fleet_map
        if self.sub is None:   # a global store
            me = self.worker.application_server
            return KeyQueryMetadata(me, sorted(s for s in fleet_map if s != me), None, GLOBAL_TASK)
        assert part is not None
        active, standbys = task_holders(fleet_map, (self.sub, part))
        return KeyQueryMetadata(active, standbys, part, str(TaskId(self.sub, part)))

    def prefix(self, prefix, limit: int = DEFAULT_LIMIT, timeout_s: float = SCAN_TIMEOUT_S) -> list[dict]:
        """Entries whose key bytes start with ``prefix``'s (a ``str`` is taken as UTF-8, ``bytes``
        as they are), over every task of this store this worker runs, in key order per task."""
        return self.page(prefix, limit, timeout_s=timeout_s).entries

    def scan(self, prefix, limit: int = DEFAULT_LIMIT,
             timeout_s: float = SCAN_TIMEOUT_S) -> tuple[list[dict], list[int]]:
        """``prefix``'s entries here, and the partitions they were read from (``page``)."""
        page = self.page(prefix, limit, timeout_s=timeout_s)
        return page.entries, page.partitions

    def page(self, prefix, limit: int = DEFAULT_LIMIT, after: Cursor | None = None,
             timeout_s: float = SCAN_TIMEOUT_S) -> ScanPage:
        """A page of ``prefix``'s entries here, from ``after`` (exclusive; None: the start), at
        most ``limit``: every partition of this store whose task runs here (open, not restoring),
        scanned or cut off by ``limit`` (a fleet's scan knows from them which partitions nobody
        answered for), read on the main loop in slices (the module's invariants)."""
        if self.windowed:
            raise QueryError(f"store {self.name!r} is a {self.spec.kind} store: it answers a key "
                             f"(/stores/{self.name}/<key>: every live window of it), not a prefix scan")
        if limit < 1:
            raise QueryError(f"limit must be 1 or more, not {limit}")
        if after is not None and (after.partition is None) != self.is_global:
            raise QueryError(f"after={after}: not a cursor of store {self.name!r}")
        pb = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        return self.worker.queries.call_steps(lambda: self._scan(pb, limit, after), timeout_s)

    def partition_count(self) -> int:
        """The partitions of this store's sub-topology (its tasks)."""
        w = self.worker
        return max(n for t, n in w.partition_counts.items() if w.task_manager.sub_of_topic.get(t) == self.sub)

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
        topics = sorted((t in w.internal_topics, t) for t, s in w.task_manager.sub_of_topic.items() if s == self.sub)
        for _, t in topics:
            p = w.routing.partitioner_of(t)
            if p.places(kb):
                return p.partition(kb, w.partition_counts[t])
        raise QueryError(f"store {self.name!r}: no input topic of its sub-topology places key {kb!r}")

    def _lookup(self, kb: bytes, stale: bool = False) -> tuple[dict | None, dict]:
        w = self.worker
        if self.is_global:
            where: dict = {"partition": None, "task": GLOBAL_TASK}
            raw = self._global_store().get(kb)
            return (None if raw is None else {**decode_entry(self.spec, kb, raw), **where}), where
        sub = self.sub
        assert sub is not None   # a task store's view (a global one returned above)
        part = self._partition_of(kb)
        task_id = str(TaskId(sub, part))
        where = {"partition": part, "task": task_id}
        task = w.tasks.get((sub, part))
        stores: Any = None if task is None else task.stores
        standby_tasks = w.standby_tasks
        if stores is None and stale and standby_tasks is not None and (sub, part) in standby_tasks.dbs:
            if not standby_tasks.caught_up_once((sub, part)):
                # a copy that never reached a commit of the task's may lack rows: not an answer
                raise StoreNotReady(f"store {self.name!r}: the standby replica of task {task_id} here has not "
                                    f"caught up yet")
            stores, where = _AsCommitted(standby_tasks.dbs[(sub, part)]), {**where, "stale": True}
        if stores is None:
            if any((sub, part) in r.keys for r in w.task_manager.restoring):
                raise StoreNotReady(f"store {self.name!r}: task {task_id} (partition {part}) is being restored")
            raise KeyNotHosted(f"store {self.name!r}: the key belongs to partition {part} (task {task_id}), "
                               f"which this worker does not run", part, task_id)
        if self.windowed:
            entry = self._windows(stores, kb)
        else:
            raw = stores.store(self.name).get(kb)
            entry = None if raw is None else decode_entry(self.spec, kb, raw)
        return (None if entry is None else {**entry, **where}), where

    def _windows(self, stores, kb: bytes) -> dict | None:
        from processor import papi_windowed
        from processor.state.store import BOOKKEEPING_STORE

        cls = papi_windowed.WindowStore if self.spec.kind == "window" else papi_windowed.SessionStore
        view = cls(self.name, stores.store(self.name), stores.store(BOOKKEEPING_STORE),
                   self.spec.key_serde, self.spec.value_serde, lambda: 0)
        windows = []
        for k, v in view.live_entries(kb):
            e = decode_entry(self.spec, k, v)
            del e["key"]
            windows.append(e)
        if not windows:
            return None
        return {"key": self.key_serde.deserialize(kb), "windows": windows}

    def _scan(self, pb: bytes, limit: int, after: Cursor | None) -> Generator[None, None, ScanPage]:
        """Main loop, a slice per ``next``: a page of the scan (``page``)."""
        w = self.worker
        page = ScanPage()
        hi = prefix_upper_bound(pb)
        if self.is_global:
            parts: list[int | None] = [None]
        else:
            page.partitions = sorted(part for (sub, part) in w.tasks if sub == self.sub)
            parts = [p for p in page.partitions if after is None or after.partition is None or p >= after.partition]
        for part in parts:
            lo = pb
            if after is not None and after.partition == part:
                lo = max(pb, after.key + b"\x00")   # (the smallest key after it)
            while True:
                if part is None:
                    store = self._global_store()
                else:
                    assert self.sub is not None   # (a task store's view)
                    task = w.tasks.get((self.sub, part))
                    if task is None:   # moved away between two slices: not read here
                        page.partitions.remove(part)
                        break
                    store = task.stores.store(self.name)
                read, last = 0, None
                for k, v in store.range(lo, hi):
                    if v is None:
                        continue
                    if len(page.entries) >= limit:
                        page.next = page.cursors[-1] if page.cursors else after
                        return page
                    if read >= SCAN_SLICE:
                        last = k
                        break
                    where = ((None, GLOBAL_TASK) if part is None or self.sub is None
                             else (part, str(TaskId(self.sub, part))))
                    page.entries.append({**decode_entry(self.spec, k, v), "partition": where[0], "task": where[1]})
                    page.cursors.append(Cursor(part, k))
                    read += 1
                if last is None:
                    break   # this partition is read
                lo = last   # the next slice starts at the first key not read
                yield
        return page


class _AsCommitted:
    """A standby replica's database as a task's stores, read as of its last applied commit
    unit: ``store(name)`` answers ``get`` and ``range`` without the writes a pass keeps pending."""

    def __init__(self, db) -> None:
        self._db = db

    def store(self, name: str) -> _CommittedStore:
        return _CommittedStore(self._db.store(name))


class _CommittedStore:
    def __init__(self, store) -> None:
        self._store = store

    def get(self, key):
        return self._store.committed(key)

    def range(self, lo=None, hi=None):
        return self._store.committed_range(lo, hi)
