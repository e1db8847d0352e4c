"""Task: one partition number of one sub-topology, the unit of processing and of state.

The worker, the test driver and the backfill all run records through this class, so they run
the same operator code against the same store layout. A Task does no Kafka I/O: records come in
as bytes with their provenance, results leave through a collector (``send(topic, key, value,
timestamp, headers)``), and state lives in a store provider (``store(name)``, ``commit(offsets)``,
``read_checkpoint()``): the host protocols of ``processor/engine/protocols.py``.

Task is the record loop; each of its other jobs lives in its own module, which states its rule:
the dead-letter policy and KIP-1034 headers (``dead_letters.py``), record-size accounting
(``record_size.py``), provenance de-duplication (``replay_filter.py``), the key placement check
(``routing.py``), the outbox entries in the task store (``processor/state/stored_outbox.py``),
foreign-key record coalescing (``fk_join_coalescing.py``) and sink convergence
(``sink_convergence.py``). The per-record path binds their checks once, at open.

Invariants:
- ``positions`` holds, per input topic-partition, the next offset to process; it advances only
  after a record has been fully processed (or dead-lettered / skipped by policy).
- ``commit()`` persists store writes and ``positions`` as one unit. The host must flush the
  collector BEFORE calling it (outputs durable before the offsets that produced them).
- Records from internal topics carry a provenance header; the task keeps per (input topic,
  source topic, source partition) the highest ``(offset, sequence)`` applied (``_bookkeeping`` store,
  committed with the state) and drops anything at or below it (``duplicates_dropped``). A
  replay upstream therefore never changes state downstream twice (``processor/provenance.py``).
- Internal records sent outside an input record (punctuation, flush) go through the outbox:
  persisted with the state at commit, sent after it, resent if the task reopens before the
  next commit confirmed them (``processor/state/outbox.py``). They carry the provenance
  ``("__punctuation:<sub-topology>", partition, <commit counter>, <index>)``.
- The task's stream time (``context.stream_time``) is the largest timestamp of the input records
  it has processed, the one in hand included (Kafka Streams' task stream time). A sub-topology
  with a user processor keeps it in ``_bookkeeping`` (committed with the state; a record that
  fails, even in deserialization, leaves it where it was) and, after each record that advanced
  it, runs the user processors' stream-time punctuations (``punctuate_task_time``) as part of
  that record (an output of theirs too large for the producer is fatal, not the record's).
- A record that fails follows the ``on_error`` policy: its key or value does not deserialize (on
  a user topic; an internal record this build cannot read is always fatal: those bytes are ours),
  a user function raises (``UserFunctionError``), a value does not serialize for a store or an
  output (``SerializationError``), or an output is larger than ``max_record_bytes``
  (``OutputError``). ``dlq`` (default) sends the input record's original
  bytes to the dead-letter topic with KIP-1034's headers (``DLQ_HEADERS``), ``skip`` counts and
  logs it, ``fail`` raises (the worker exits 6 naming the step, function and record).
- Under ``dlq`` and ``skip`` a record is all or nothing: its store writes are journaled and its
  records buffered until it has been processed, so a record that fails leaves no store write
  and no output behind (the journal is undone, the buffer dropped, the operators rebuilt from
  the stores, which hold all of their state). Every input record ends processed or
  dead-lettered/skipped, never half applied. A failure outside an input record (punctuation,
  flush) has no record to dead-letter and is fatal.
- With ``origin`` (the application id; the worker passes it) the records of table sinks carry
  ``processor.origin``; after a crash the host hands the task its sinks' tails
  (``start_convergence``) and the task makes those sinks converge to its tables once its replay
  has caught up (``processor/engine/sink_convergence.py``).
- With ``stage_internal`` (the worker passes it unless the broker hides aborted transactions
  from its readers), a sub-topology that reads more than one topic sends its records to
  deduplicated internal topics (repartition) through the outbox: only after the commit that
  persists the state they came from. Its replay after a crash reads its inputs in another
  interleaving and so may produce other records for the same input records; the receiving task,
  which drops replays by provenance, must therefore only ever see records of committed units
  (the copies of a resent outbox are identical, so dropping them is exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from processor import provenance
from processor.config import ON_ERROR_POLICIES
from processor.engine.dead_letters import DLQ_HEADERS, STACKTRACE_LIMIT, DeadLetters, dead_letter_headers, dlq_topic_for
from processor.engine.fk_join_coalescing import ForeignKeyJoinRecordCoalescer
from processor.engine.protocols import RecordCollector, StoreProvider, WallClock
from processor.engine.record_size import (
    DEFAULT_MAX_RECORD_BYTES,
    DirectSends,
    check_sizes,
    max_record_bytes_of,
    room_beside,
    room_for,
)
from processor.engine.record_size import wire_size as _wire_size
from processor.engine.replay_filter import Mark, ReplayFilter
from processor.engine.routing import KeyPlacementCheck, Routing
from processor.engine.sink_convergence import SinkConvergence
from processor.engine.task_id import TaskId
from processor.errors import (
    DeserializationError,
    OutputError,
    ProcessingError,
    ProcessorError,
    RecordError,
    SerializationError,
    UserFunctionError,
)
from processor.operators.base import Processor, ProcessorContext
from processor.state import source_changelog
from processor.state.store import BOOKKEEPING_STORE, TASK_STORE
from processor.state.stored_outbox import OUTBOX_CHUNK_BYTES, StoredOutbox

# the names importers take from this module (the worker, the driver, the backfill, tests)
__all__ = ["DEFAULT_MAX_RECORD_BYTES", "DLQ_HEADERS", "ERROR_POLICIES", "OUTBOX_CHUNK_BYTES", "STACKTRACE_LIMIT",
           "UNORDERED", "Task", "_wire_size", "dead_letter_headers", "dlq_topic_for", "max_record_bytes_of"]

ERROR_POLICIES = ON_ERROR_POLICIES   # defined once, in processor/config.py

# Task.event_time of a record whose extraction fails: ordered before every other
UNORDERED = -1
_STREAM_TIME = b"stream_time"    # _bookkeeping: the task's stream time (8 bytes, signed big-endian)


class Task:
    def __init__(self, topology, sub_id: int, partition: int, stores: StoreProvider, collector: RecordCollector,
                 wall_clock: WallClock, on_error: str = "dlq", dlq_topic: str | None = None,
                 routing: Routing | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 journal: bool | None = None, origin: str | None = None, stage_internal: bool = False,
                 coalesce_fk_records: bool = False, topic_exists: Callable[[str], bool] | None = None,
                 global_stores: dict | None = None, dead_letter_max_bytes: int | None = None):
        if on_error not in ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ERROR_POLICIES}, not {on_error!r}")
        if on_error == "dlq" and not dlq_topic:
            raise ValueError("on_error='dlq' needs a dead-letter topic")
        self.id = str(TaskId(sub_id, partition))
        self.sub_id = sub_id
        self.partition = partition
        self.topology = topology
        self.stores = stores
        self.collector = collector
        self.on_error = on_error
        self.dlq_topic = dlq_topic
        self._dead_letters = DeadLetters(on_error, dlq_topic, collector, self.id, dead_letter_max_bytes)
        self.context = ProcessorContext(self.id, stores, collector, wall_clock, partition)
        self.routing = self.context.routing = routing or Routing()
        if topic_exists is not None:   # the host's view of which user topics exist (to(extractor))
            self.context.topic_exists = topic_exists
        if global_stores:              # the host's global tables, shared by its tasks
            self.context.global_stores = global_stores
        if origin is not None:
            self.context.origin_head, self.context.origin_app = provenance.origin_parts(origin, sub_id, partition)
        self._convergence: SinkConvergence | None = None
        self.converged_in_unit = False
        self._convergence_metrics: dict[str, int] = {}
        self.task_store = stores.store(TASK_STORE)            # host-local: the outbox
        # contract: the high-water marks (the outbox counter is host-local: it counts commits)
        self.bookkeeping = stores.store(BOOKKEEPING_STORE)
        self.max_record_bytes = max_record_bytes
        # the key + value bytes an output may take without an exact count (record_size.py)
        self.output_room = room_for(max_record_bytes)
        # each record's outputs are buffered until it is processed (and checked against
        # max_record_bytes); under dlq and skip its store writes are journaled too. A host that
        # throws the task's state away when a record fails (``failed_in_processing``) and runs it
        # again with the journal may start without it (``journal=False``: the backfill).
        self._atomic = on_error != "fail" if journal is None else journal
        self._journal: list = []
        self._direct: DirectSends | None = None
        if journal is False:
            # a host that throws the task away when a record fails needs no held outputs either
            self.context.sends = self._direct = DirectSends(self)
        self._record_sends = self.context.sends
        self._retired_metrics: dict[str, dict[str, int]] = {}
        self.internal_topics: set[str] = set()     # deduplicated by provenance
        self._internal_sources: set[str] = set()   # every internal topic: never dead-lettered
        for n in topology.subtopologies[sub_id]:
            if n.source_topic:
                # Internal topics are deduplicated by provenance, except where applying a record
                # twice is harmless and a replay must be applied again (FK subscriptions).
                if n.attrs.internal and n.attrs.dedup:
                    self.internal_topics.add(n.source_topic)
                if n.attrs.internal:
                    self._internal_sources.add(n.source_topic)
        raw = self.bookkeeping.get(_STREAM_TIME)
        self.context.stream_time = -1 if raw is None else int.from_bytes(raw, "big", signed=True)
        self.ops: dict[str, Any] = {}   # node name -> its operator (a Processor subclass)
        self._build_operators()
        # foreign-key join records held until the commit, a later one of the same pair replacing
        # an earlier (processor/engine/fk_join_coalescing.py)
        self._coalescer: ForeignKeyJoinRecordCoalescer | None = None
        self._send = collector.send
        if coalesce_fk_records and journal is not False:
            topics = {n.sink_topic: n.attrs.coalesce for n in topology.subtopologies[sub_id]
                      if n.sink_topic and getattr(n.attrs, "coalesce", None)}
            if topics:
                self._coalescer = ForeignKeyJoinRecordCoalescer(topics, collector)
                self._send = self._coalescer.send
        if stage_internal and len(self.sources) > 1:
            deduplicated = topology.deduplicated_topics()
            self.context.staged_topics = frozenset(
                n.sink_topic for n in topology.subtopologies[sub_id]
                if n.sink_topic and n.attrs.internal and n.sink_topic in deduplicated)
        # topics whose every key is checked against its partitioner (docs/semantics.md "Partitioning")
        placement = KeyPlacementCheck(self.routing.checks(self.sources))
        self._placement_checks = placement.topics
        self._check_placement = placement.check
        # internal records already applied are dropped (replay_filter.py)
        self._check_provenance = ReplayFilter(self.bookkeeping, f"task {self.id}").check
        self.store_specs = topology.stores_of(sub_id)
        # the local checkpoint also holds changelog end offsets: keep the input partitions only
        self.positions: dict[tuple[str, int], int] = {
            tp: off for tp, off in stores.read_checkpoint().items() if tp[0] in self.sources}
        # per input topic: records that deserialized but failed later (a user function, an output)
        self.failed_in_processing: dict[str, int] = {}
        # user topics that are a table's changelog -> its store: each rejected record's offset and
        # the row its key had are kept in the task store, so a restore from the topic puts that
        # row back instead of applying the record (processor/state/source_changelog.py)
        self._reused_sources = {topic: name for name, topic in topology.source_changelogs_of(sub_id).items()}
        self.processed = 0
        self.duplicates_dropped = 0
        # the worker's input buffers (processor/runtime/partition_group.py) count these
        self.enforced_processing = 0
        self.idle_waits = 0
        self.buffer_pauses = 0
        # (OUTBOX_CHUNK_BYTES is read here, from this module: tests make it small)
        self._stored_outbox = StoredOutbox(self.task_store, OUTBOX_CHUNK_BYTES)
        self._punctuation_sequence = 0
        records = self._stored_outbox.load()
        if records:  # sent before a crash, maybe not delivered: send again
            self._send_outbox(records)

    def _build_operators(self) -> None:
        """Instantiate the sub-topology's operators over the task's stores (at open, and after a
        failed record's writes were undone: operators keep no state the stores do not hold)."""
        if getattr(self, "ops", None):   # (none yet at open)
            for name, op in self.ops.items():
                if op.closes_on_rebuild:   # a user processor: its instance is replaced
                    op.close()
                if m := op.metrics():
                    kept = self._retired_metrics.setdefault(name, {})
                    for k, v in m.items():
                        kept[k] = kept.get(k, 0) + v
        self.ops = self.topology.instantiate(self.sub_id, self.context)
        self.sources: dict[str, list] = {}   # topic -> its source operators, in graph order
        for n in self.topology.subtopologies[self.sub_id]:
            if n.source_topic:
                self.sources.setdefault(n.source_topic, []).append(self.ops[n.name])
        # topic -> its first source's event_time, where that source has a timestamp extractor
        self._extractors = {topic: srcs[0].event_time for topic, srcs in self.sources.items()
                            if srcs[0].timestamp_extractor is not None}
        self.extracts_time = bool(self._extractors)
        ops = list(self.ops.values())
        self._wall_punctuators = [op for op in ops if op.punctuates_wall]
        self._stream_punctuators = [op for op in ops if op.punctuates_task_time]
        self._flushers = [op for op in ops if type(op).flush is not Processor.flush]
        if self._atomic:
            self.stores.journal = self._journal     # stores opened from now on
            for store in self.stores.stores.values():
                store.journal = self._journal

    # -- processing ---------------------------------------------------------------------------
    def process(self, topic, partition, offset, timestamp, key, value, headers=None, event_time=None) -> None:
        """Process one input record to completion (or reject it by the on-error policy).
        ``event_time``: its extracted time where the host already asked ``event_time`` (a
        topic with a timestamp extractor; None: extracted here)."""
        ctx = self.context
        ctx.topic = topic
        ctx.partition = partition
        ctx.offset = offset
        ctx.headers = headers
        ctx.sequence = 0
        ctx.in_record = True
        record_timestamp = timestamp
        self.stores.writer = (topic, partition, offset)
        mark: Mark | Literal[False] | None = None
        if self._placement_checks and key is not None and topic in self._placement_checks:
            self._check_placement(topic, partition, offset, key)
        sends = self._record_sends
        if sends:                    # left by a record that failed under on_error=fail
            sends.clear()
        if self._direct is not None:
            self._direct.room = None
        outbox_len = len(ctx.outbox)
        if self._atomic:
            self._journal.clear()
        advanced: list | bool = False   # (the stream punctuators, empty, or whether time moved)
        try:
            if topic in self.internal_topics:
                mark = self._check_provenance(topic, headers)
                if mark is False:
                    self.duplicates_dropped += 1
                    self.positions[(topic, partition)] = offset + 1
                    return
            if self._extractors and topic in self._extractors:
                # the event time is the record's time from here on (the dead-letter topic gets
                # the record as it was: record_timestamp)
                timestamp = self._extractors[topic](key, value, timestamp) if event_time is None else event_time
            advanced = self._stream_punctuators and timestamp > ctx.stream_time
            if advanced:   # (stream time includes the record in hand; put back if it fails)
                before = ctx.stream_time
                ctx.stream_time = timestamp
            for source in self.sources[topic]:
                source.process_bytes(key, value, timestamp)
            if mark:   # (a mark entry: not None, not False)
                self.bookkeeping.put(*mark)
            if sends:   # (the hot path of _check_sizes, inline)
                room = self.output_room
                if headers:
                    room = room_beside(room, headers)
                for r in sends:
                    k, v = r[1], r[2]
                    if (len(v) if v else 0) + (len(k) if k else 0) > room:
                        self._check_sizes(headers)
                        break
            if len(ctx.outbox) > outbox_len:   # internal records queued behind an earlier outbox entry
                self._check_sizes(headers, ctx.outbox[outbox_len:])
            if advanced:   # the record is done: the task's stream time moves, then punctuates
                self.bookkeeping.put(_STREAM_TIME, timestamp.to_bytes(8, "big", signed=True))
                self._punctuate_stream_time(timestamp, outbox_len)
        except DeserializationError as exc:
            if topic in self._internal_sources:
                # our own records: a newer build's format or corruption, not user input
                raise ProcessingError(f"an internal record this build cannot read ({exc.reason}); "
                                      f"stopping (internal topics are never dead-lettered)",
                                      topic=topic, partition=partition, offset=offset,
                                      step=exc.step) from exc
            # not the topic's first source: an earlier one (another source of the same topic with
            # other serdes) may have written already (a host that runs without the journal must
            # run the task again: failed_in_processing)
            if advanced:   # a failed record leaves stream time where it was
                ctx.stream_time = before
            self._reject(exc, exc.step != self.sources[topic][0].name, outbox_len,
                         topic, partition, offset, record_timestamp, key, value, headers)
        except (UserFunctionError, SerializationError) as exc:   # incl. OutputError
            if advanced:
                ctx.stream_time = before
            # (a timestamp extractor's failure, at the topic's first source, is before any write)
            self._reject(exc, not (type(exc) is UserFunctionError and exc.step == self.sources[topic][0].name),
                         outbox_len, topic, partition, offset, record_timestamp, key, value, headers)
        except RecordError as exc:
            raise exc.with_provenance(topic, partition, offset) from exc.__cause__
        except ProcessorError as exc:
            if self._atomic:
                # not the record's doing (a registry outage): it leaves nothing behind, so what the
                # task did before it may still be committed (the host does, then stops)
                if advanced:
                    ctx.stream_time = before
                self._undo_record(outbox_len)
                exc.undone_record = (topic, partition, offset)
            raise
        except Exception as exc:
            raise ProcessingError(f"{type(exc).__name__}: {exc}", topic=topic, partition=partition,
                                  offset=offset, step=f"task {self.id}") from exc
        if sends:
            if self._convergence is not None:
                self._convergence.saw(sends)
            send = self._send
            for r in sends:
                send(*r)
            sends.clear()
        self.positions[(topic, partition)] = offset + 1
        self.processed += 1

    def event_time(self, topic, key, value, timestamp) -> int:
        """The time a host orders this input record by before processing it: its source's
        timestamp extractor's result where there is one (``extracts_time``), else ``timestamp``.
        A record whose extraction fails (or that does not deserialize) gets ``UNORDERED`` (-1):
        it goes first, changing nothing (``process`` applies the on-error policy to it), and
        never holds back the records behind it, as Kafka Streams drops such a record at the head
        of its partition's queue."""
        extract = self._extractors.get(topic)
        if extract is None:
            return timestamp
        try:
            return extract(key, value, timestamp)
        except RecordError:
            return UNORDERED

    def _punctuate_stream_time(self, now: int, outbox_len: int) -> None:
        """The user processors' stream-time punctuations after a record that moved stream time:
        their outputs go out with the record's, but one too large is fatal (a punctuation is no
        record's doing: the record is not dead-lettered for it)."""
        sends, outbox = self._record_sends, self.context.outbox
        n_sends, n_outbox = len(sends), len(outbox)
        for op in self._stream_punctuators:
            op.punctuate_task_time(now)
        try:
            if len(sends) > n_sends:
                self._check_sizes(None, sends[n_sends:])
            if len(outbox) > n_outbox:
                self._check_sizes(None, outbox[n_outbox:])
        except OutputError as exc:
            raise ProcessingError(f"a stream-time punctuation's output: {exc}", step=exc.step) from exc

    def _reject(self, exc, after_writes: bool, outbox_len: int, topic, partition, offset, timestamp, key, value,
                headers) -> None:
        """A record failed (``exc``): leave nothing of it behind, then apply the on_error policy.
        ``after_writes``: it may have written before failing (``failed_in_processing``)."""
        if after_writes:
            self.failed_in_processing[topic] = self.failed_in_processing.get(topic, 0) + 1
        if self._atomic:
            self._undo_record(outbox_len)
        else:
            self._record_sends.clear()
        self._dead_letters.reject(exc.with_provenance(topic, partition, offset), key, value, timestamp, headers,
                                  self.max_record_bytes)
        if topic in self._reused_sources:
            row = None if key is None else self.stores.store(self._reused_sources[topic]).get(key)
            self.task_store.put(source_changelog.failed_key(topic, partition, offset),
                                source_changelog.encode_failed(row))

    def _send_record_outputs(self) -> None:
        if self._convergence is not None:
            self._convergence.saw(self._record_sends)
        send = self._send
        for r in self._record_sends:
            send(*r)
        self._record_sends.clear()

    def _check_sizes(self, headers, records=None) -> None:
        """Every record this input record produces must fit the producer's ``message.max.bytes``
        (counted as librdkafka counts it), or none is sent (``OutputError``; record_size.py)."""
        room = room_beside(self.output_room, headers) if headers else self.output_room
        check_sizes(self._record_sends if records is None else records, room, self.max_record_bytes)

    def _undo_record(self, outbox_len: int) -> None:
        """Leave no trace of the record in hand: undo its store writes (newest first), drop its
        buffered records and outbox entries, and rebuild the operators from the stores when
        anything had changed (their in-memory state follows the stores)."""
        journal = self._journal
        changed = bool(journal or self._record_sends or len(self.context.outbox) > outbox_len)
        for store, key, previous in reversed(journal):
            store.undo(key, previous)
        journal.clear()
        self._record_sends.clear()
        del self.context.outbox[outbox_len:]
        if changed:
            self._build_operators()

    def _outside_record(self, what: str, fn) -> None:
        """Run a punctuation or flush: no input record is in hand. Its provenance is synthetic,
        ``("__punctuation:<sub>", partition, <the outbox counter of the commit that will persist
        its records>)``, with sequence numbers running on across every punctuation and flush
        until that commit, so each internal record it sends has a unique, increasing one."""
        ctx = self.context
        ctx.topic = f"__punctuation:{self.sub_id}"
        ctx.partition = self.partition
        ctx.offset = self._stored_outbox.counter + 1
        ctx.sequence = self._punctuation_sequence
        ctx.in_record = False
        ctx.headers = None
        ctx.source_value = ctx.source_value_bytes = ctx.source_value_serde = None
        self.stores.writer = (ctx.topic, ctx.partition, ctx.offset)
        self._journal.clear()
        self._record_sends.clear()   # (left by a record that failed fatally: never sent)
        if self._direct is not None:
            self._direct.room = None
        try:
            fn()
            if self._record_sends:
                self._check_sizes(None)
                self._send_record_outputs()
        except ProcessorError:
            raise
        except Exception as exc:
            raise ProcessingError(f"{type(exc).__name__}: {exc}", step=f"task {self.id} {what}") from exc
        finally:
            self._journal.clear()
            self._punctuation_sequence = ctx.sequence

    def punctuate_wall(self, now_ms: int) -> None:
        """Wall-clock punctuation (worker: every loop; driver: ``advance_wall_clock``)."""
        if self._wall_punctuators:
            def run():
                for op in self._wall_punctuators:
                    op.punctuate_wall(now_ms)
            self._outside_record("wall-clock punctuation", run)

    def flush(self) -> None:
        """Forward every deferred emission (graceful shutdown, partition revocation)."""
        if self._flushers:
            def run():
                for op in self._flushers:
                    op.flush()
            self._outside_record("flush", run)

    @property
    def dead_lettered(self) -> int:
        """Input records sent to the dead-letter topic."""
        return self._dead_letters.dead_lettered

    @property
    def dead_lettered_cut(self) -> int:
        """Of the dead-lettered records, those sent as stubs (too large whole; dead_letters.py)."""
        return self._dead_letters.cut

    @property
    def skipped_poison(self) -> int:
        """Input records skipped under ``on_error='skip'``."""
        return self._dead_letters.skipped

    # -- lifecycle ----------------------------------------------------------------------------
    def commit(self) -> dict[tuple[str, int], int]:
        """Persist store writes and positions as one unit; returns the positions committed.
        (A host without changelogs; the worker runs ``prepare_commit`` / ``finish_commit``
        around producing the changelog, see ``processor/runtime/changelog.py``.)"""
        pos, records = self.prepare_commit()
        self.finish_commit(pos, records)
        return pos

    # -- convergence of table sinks after a crash -------------------------------------------------
    def start_convergence(self, tails: dict[str, dict], targets: dict[tuple[str, int], int]) -> None:
        """The host read, from the table sinks, the records this task sent after its last commit:
        ``tails`` ``{topic: {key bytes: last value bytes}}``, ``targets`` ``{input partition: offset
        after the last input record that caused one}`` (``processor/engine/sink_convergence.py``)."""
        conv = SinkConvergence(tails, targets)
        self._convergence = conv if conv.tails else None

    @property
    def convergence_pending(self) -> bool:
        return self._convergence is not None

    def _converge_if_caught_up(self) -> None:
        conv = self._convergence
        if conv is None or not conv.reached(self.positions):
            return
        self._convergence = None
        self._outside_record("sink convergence", lambda: conv.run(self))
        self.converged_in_unit = True   # the host commits this unit even without new input
        for k, v in conv.metrics().items():
            self._convergence_metrics[k] = self._convergence_metrics.get(k, 0) + v

    @property
    def holds_records(self) -> bool:
        """Foreign-key join records wait for the next commit (``fk_join_coalescing``)."""
        return self._coalescer is not None and bool(self._coalescer.held)

    def prepare_commit(self):
        """First half of a commit: settle the outbox into the task store's pending writes.
        Returns ``(positions, outbox records)``; every store write of this unit is now pending.
        A pending sink convergence whose targets the positions reached runs first (its records
        belong to this unit)."""
        if self._convergence is not None:
            self._converge_if_caught_up()
        if self._coalescer is not None:
            self._coalescer.flush()   # before the positions of the records that caused them commit
        pos = dict(self.positions)
        stored = self._stored_outbox
        self.stores.writer = (f"__commit:{self.sub_id}", self.partition, stored.counter + 1)
        stored.confirm()   # the host flushed the collector before this commit
        records = self.context.outbox
        self._punctuation_sequence = 0
        if records:
            self.context.outbox = []
            if self._coalescer is not None:
                records = self._coalescer.supersede(records)
            counter = stored.counter + 1
            source = f"__punctuation:{self.sub_id}"
            n = 0
            for i, (topic, key, value, ts, headers, part) in enumerate(records):
                if provenance.find(headers) is None:
                    prov = provenance.encode(source, self.partition, counter, n)
                    records[i] = (topic, key, value, ts, list(headers or ()) + [(provenance.HEADER, prov)], part)
                    n += 1
            stored.persist(records, counter)
        return pos, records

    def finish_commit(self, pos, records, changelog_ends=None) -> None:
        """Second half: write the pending state, the positions and the changelog end offsets as
        one local batch, then send the outbox (its records are durable in the state now)."""
        self.stores.commit({**pos, **changelog_ends} if changelog_ends else pos)
        if records:
            self._send_outbox(records)

    def _send_outbox(self, records) -> None:
        for topic, key, value, ts, headers, part in records:
            self.collector.send(topic, key, value, ts, headers, part)
        self._stored_outbox.unconfirmed = True

    def metrics(self) -> dict[str, dict[str, int]]:
        out = {name: m for name, op in self.ops.items() if (m := op.metrics())}
        for name, kept in self._retired_metrics.items():   # counts of operators rebuilt after an undo
            m = out.setdefault(name, {})
            for k, v in kept.items():
                m[k] = m.get(k, 0) + v
        out["task"] = {"processed": self.processed, "dead_lettered": self.dead_lettered,
                       "dead_lettered_cut": self.dead_lettered_cut, "skipped_poison": self.skipped_poison,
                       "duplicates_dropped": self.duplicates_dropped}
        if self.enforced_processing or self.idle_waits or self.buffer_pauses:
            out["task"]["enforced_processing"] = self.enforced_processing
            out["task"]["idle_waits"] = self.idle_waits
            out["task"]["buffer_pauses"] = self.buffer_pauses
        if self._convergence_metrics:
            out["sink convergence"] = dict(self._convergence_metrics)
        if self._coalescer is not None:   # on the sink of the topic: what its records_out did not send
            for name, op in self.ops.items():
                if getattr(op, "topic", None) in self._coalescer.coalesced and op.kind == "sink":
                    out.setdefault(name, {})["records_coalesced"] = self._coalescer.coalesced[op.topic]
        return out

    def close(self) -> None:
        """Close every operator (each, even after one raised: the first error is raised once
        all are closed), then the stores."""
        error = None
        try:
            for op in self.ops.values():
                try:
                    op.close()
                except Exception as exc:
                    error = error or exc
        finally:
            self.stores.close()
        if error is not None:
            raise error

