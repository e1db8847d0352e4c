"""Task: one partition number of one sub-topology, the unit of processing and of state.

The worker, the test driver and the backfill all run records through this class, so they run
the same operator code against the same store layout. A Task does no Kafka I/O: records come in
as bytes with their provenance, results leave through a collector (``send(topic, key, value,
timestamp, headers)``), and state lives in a store provider (``store(name)``, ``commit(offsets)``,
``read_checkpoint()``).

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
- Poison input (a key/value that does not deserialize) on a user topic follows the ``on_error`` policy
  (on an internal topic it is always fatal: those bytes are ours, never user input):
  ``dlq`` (default) sends the original bytes to the dead-letter topic with provenance headers,
  ``skip`` counts and logs it, ``fail`` raises. Errors in user functions always fail loudly,
  naming the record and the step.
"""

from __future__ import annotations

import logging

from processor import provenance
from processor.engine.routing import Routing, misplaced_key
from processor.errors import DeserializationError, ProcessingError, ProcessorError, RecordError
from processor.operators.base import Processor, ProcessorContext
from processor.state import outbox as outbox_codec
from processor.state.store import BOOKKEEPING_STORE, TASK_STORE

log = logging.getLogger("processor.task")

ERROR_POLICIES = ("dlq", "skip", "fail")

# Dead-letter record headers (values UTF-8).
DLQ_HEADERS = ("dlq.source.topic", "dlq.source.partition", "dlq.source.offset", "dlq.step", "dlq.error")


_PLACEMENT_CACHE = 100_000   # keys per checked topic whose placement is remembered

_OUTBOX = b"outbox"
_OUTBOX_COUNTER = b"outbox_counter"


def dlq_topic_for(application_id: str) -> str:
    return f"{application_id}-dlq"


class Task:
    def __init__(self, topology, sub_id: int, partition: int, stores, collector, wall_clock,
                 on_error: str = "dlq", dlq_topic: str | None = None, routing: Routing | None = None):
        if on_error not in ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ERROR_POLICIES}, not {on_error!r}")
        if on_error == "dlq" and not dlq_topic:
            raise ValueError("on_error='dlq' needs a dead-letter topic")
        self.id = f"{sub_id}_{partition}"
        self.sub_id = sub_id
        self.partition = partition
        self.topology = topology
        self.stores = stores
        self.collector = collector
        self.on_error = on_error
        self.dlq_topic = dlq_topic
        self.context = ProcessorContext(self.id, stores, collector, wall_clock, partition)
        self.routing = self.context.routing = routing or Routing()
        self.task_store = stores.store(TASK_STORE)            # host-local: the outbox
        # contract: the high-water marks (the outbox counter is host-local: it counts commits)
        self.bookkeeping = stores.store(BOOKKEEPING_STORE)
        self.ops = topology.instantiate(sub_id, self.context)
        self.sources: dict[str, list] = {}   # topic -> its source operators, in graph order
        self.internal_topics = set()          # deduplicated by provenance
        self._internal_sources = set()        # every internal topic: never dead-lettered
        for n in topology.subtopologies[sub_id]:
            if n.source_topic:
                self.sources.setdefault(n.source_topic, []).append(self.ops[n.name])
                # Internal topics are deduplicated by provenance, except where applying a record
                # twice is harmless and a replay must be applied again (FK subscriptions).
                if n.attrs.internal and n.attrs.dedup:
                    self.internal_topics.add(n.source_topic)
                if n.attrs.internal:
                    self._internal_sources.add(n.source_topic)
        # topics whose every key is checked against its partitioner (README "Partitioning")
        self._placement_checks = {t: (*c, {}) for t, c in self.routing.checks(self.sources).items()}
        ops = list(self.ops.values())
        self._wall_punctuators = [op for op in ops if op.punctuates_wall]
        self._flushers = [op for op in ops if type(op).flush is not Processor.flush]
        self.store_specs = topology.stores_of(sub_id)
        # the local checkpoint also holds changelog end offsets: keep the input partitions only
        self.positions: dict[tuple[str, int], int] = {
            tp: off for tp, off in stores.read_checkpoint().items() if tp[0] in self.sources}
        self.dead_lettered = 0
        self.skipped_poison = 0
        self.processed = 0
        self.duplicates_dropped = 0
        raw = self.task_store.get(_OUTBOX_COUNTER)
        self._outbox_counter = 0 if raw is None else int.from_bytes(raw, "big")
        self._outbox_unconfirmed = False
        self._punctuation_sequence = 0
        raw = self.task_store.get(_OUTBOX)
        if raw is not None:  # sent before a crash, maybe not delivered: send again
            self._send_outbox(outbox_codec.decode(raw))

    # -- processing ---------------------------------------------------------------------------
    def process(self, topic, partition, offset, timestamp, key, value, headers=None) -> None:
        ctx = self.context
        ctx.topic = topic
        ctx.partition = partition
        ctx.offset = offset
        ctx.headers = headers
        ctx.sequence = 0
        ctx.in_record = True
        self.stores.writer = (topic, partition, offset)
        mark = None
        if self._placement_checks and key is not None and topic in self._placement_checks:
            self._check_placement(topic, partition, offset, key)
        try:
            if topic in self.internal_topics:
                mark = self._check_provenance(topic, headers)
                if mark is False:
                    self.duplicates_dropped += 1
                    self.positions[(topic, partition)] = offset + 1
                    return
            for source in self.sources[topic]:
                source.process_bytes(key, value, timestamp)
            if mark is not None:
                self.bookkeeping.put(*mark)
        except DeserializationError as exc:
            if topic in self._internal_sources:
                # our own records: a newer build's format or corruption, not user input
                raise ProcessingError(f"an internal record this build cannot read ({exc.reason}); "
                                      f"stopping (internal topics are never dead-lettered)",
                                      topic=topic, partition=partition, offset=offset,
                                      step=exc.step) from exc
            self._poison(exc.with_provenance(topic, partition, offset), key, value, timestamp, headers)
        except RecordError as exc:
            raise exc.with_provenance(topic, partition, offset) from exc.__cause__
        except ProcessorError:
            raise
        except Exception as exc:
            raise ProcessingError(f"{type(exc).__name__}: {exc}", topic=topic, partition=partition,
                                  offset=offset, step=f"task {self.id}") from exc
        self.positions[(topic, partition)] = offset + 1
        self.processed += 1

    def _check_placement(self, topic, partition, offset, key) -> None:
        """The key must be where its topic's partitioner puts it (one hash per new key: table
        keys repeat, so a bounded cache of placements saves most of them)."""
        p, n, choice, cache = self._placement_checks[topic]
        expected = cache.get(key)
        if expected is None:
            if not p.places(key):
                return
            expected = p.partition(key, n)
            if len(cache) >= _PLACEMENT_CACHE:
                cache.clear()
            cache[key] = expected
        if expected != partition:
            raise misplaced_key(topic, partition, offset, key, expected, choice)

    def _check_provenance(self, topic, headers):
        """``False`` for a record already applied; else the high-water mark entry to write once
        it is processed (None when the record carries no provenance)."""
        raw = provenance.find(headers)
        if raw is None:
            return None
        try:
            src = provenance.decode(raw)
        except ValueError as exc:
            raise DeserializationError(f"bad {provenance.HEADER} header: {exc}", step=f"task {self.id}") from exc
        mk = provenance.mark_key(topic, src.topic, src.partition)
        seen = self.bookkeeping.get(mk)
        if seen is not None and (src.offset, src.sequence) <= provenance.decode_mark(seen):
            return False
        return mk, provenance.encode_mark(src.offset, src.sequence)

    def _outside_record(self, what: str, fn) -> None:
        """Run a punctuation or flush: no input record is in hand. Its provenance is synthetic,
        ``("__punctuation:<sub>", partition, <the outbox counter of the commit that will persist
        its records>)``, with sequence numbers running on across every punctuation and flush
        until that commit, so each internal record it sends has a unique, increasing one."""
        ctx = self.context
        ctx.topic = f"__punctuation:{self.sub_id}"
        ctx.partition = self.partition
        ctx.offset = self._outbox_counter + 1
        ctx.sequence = self._punctuation_sequence
        ctx.in_record = False
        ctx.headers = None
        ctx.source_value = ctx.source_value_bytes = ctx.source_value_serde = None
        self.stores.writer = (ctx.topic, ctx.partition, ctx.offset)
        try:
            fn()
        except ProcessorError:
            raise
        except Exception as exc:
            raise ProcessingError(f"{type(exc).__name__}: {exc}", step=f"task {self.id} {what}") from exc
        finally:
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

    def _poison(self, exc: RecordError, key, value, timestamp, headers) -> None:
        if self.on_error == "fail":
            raise exc
        if self.on_error == "skip":
            self.skipped_poison += 1
            log.warning("skipped poison record (on_error=skip): %s", exc)
            return
        prov = [
            ("dlq.source.topic", exc.topic.encode()),
            ("dlq.source.partition", str(exc.partition).encode()),
            ("dlq.source.offset", str(exc.offset).encode()),
            ("dlq.step", str(exc.step).encode()),
            ("dlq.error", exc.reason.encode("utf-8", "replace")),
        ]
        self.collector.send(self.dlq_topic, key, value, timestamp, list(headers or ()) + prov)
        self.dead_lettered += 1
        log.warning("dead-lettered poison record to %s: %s", self.dlq_topic, exc)

    # -- lifecycle ----------------------------------------------------------------------------
    def commit(self) -> dict[tuple[str, int], int]:
        """Persist store writes and positions as one unit; returns the positions committed.
        (A host without changelogs; the worker runs ``prepare_commit`` / ``finish_commit``
        around producing the changelog, see ``processor/runtime/changelog.py``.)"""
        pos, records = self.prepare_commit()
        self.finish_commit(pos, records)
        return pos

    def prepare_commit(self):
        """First half of a commit: settle the outbox into the task store's pending writes.
        Returns ``(positions, outbox records)``; every store write of this unit is now pending."""
        pos = dict(self.positions)
        self.stores.writer = (f"__commit:{self.sub_id}", self.partition, self._outbox_counter + 1)
        if self._outbox_unconfirmed:  # the host flushed the collector before this commit
            self.task_store.delete(_OUTBOX)
            self._outbox_unconfirmed = False
        records = self.context.outbox
        self._punctuation_sequence = 0
        if records:
            self.context.outbox = []
            self._outbox_counter += 1
            source = f"__punctuation:{self.sub_id}"
            n = 0
            for i, (topic, key, value, ts, headers, part) in enumerate(records):
                if provenance.find(headers) is None:
                    prov = provenance.encode(source, self.partition, self._outbox_counter, n)
                    records[i] = (topic, key, value, ts, list(headers or ()) + [(provenance.HEADER, prov)], part)
                    n += 1
            self.task_store.put(_OUTBOX, outbox_codec.encode(records))
            self.task_store.put(_OUTBOX_COUNTER, self._outbox_counter.to_bytes(8, "big"))
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
        self._outbox_unconfirmed = True

    def metrics(self) -> dict[str, dict[str, int]]:
        out = {name: m for name, op in self.ops.items() if (m := op.metrics())}
        out["task"] = {"processed": self.processed, "dead_lettered": self.dead_lettered,
                       "skipped_poison": self.skipped_poison, "duplicates_dropped": self.duplicates_dropped}
        return out

    def close(self) -> None:
        try:
            for op in self.ops.values():
                op.close()
        finally:
            self.stores.close()
