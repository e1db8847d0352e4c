"""to_stream and sinks.

``TableToStream`` turns ``Change(new, old)`` into the new value (``None``: a tombstone).
``Sink`` serializes and hands the record to the task's collector, with the input record's
timestamp and headers. A key or value that does not serialize is an ``OutputError`` (the input
record follows the ``on_error`` policy). A sink whose value reaches it only through value-preserving steps
(filters, to_stream) reuses the source's bytes instead of serializing again.

A sink with ``route_like`` (a foreign-key join's subscription sink) names the partition itself:
the key's partition under the partitioner that placed ``route_like`` (the right table's source
topic), from the host's ``Routing`` (``processor/engine/routing.py``).

A sink to an internal topic (repartition) writes the input's headers plus the provenance
header ``processor.source`` (``processor/provenance.py``): the input record's topic,
partition and offset and a sequence number, so the receiving task can drop replays.

A sink that carries a table (``SinkAttrs.carries_table``) adds the header ``processor.origin``
(the application, the task and the input record: ``processor/provenance.py``) when its task
asks for it (``ProcessorContext.origin_head``; the worker does): after a crash the task tells its
own records in the topic from the others' by it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from processor import provenance
from processor.errors import OutputError, is_operational
from processor.operators import replay as replay_semantics
from processor.operators.base import Processor, describe_function


class Routed(NamedTuple):
    """A value for an internal sink that names its partition and adds headers (foreign-key
    join responses go to the partition of the left row they answer)."""

    value: Any
    partition: int | None
    headers: list


class PassThrough(Processor):
    """Forwards what it receives (the merge point of several parents)."""

    kind = "pass-through"
    replay = replay_semantics.PASS_THROUGH

    def process(self, key, value, timestamp):
        self.forward(key, value, timestamp)


class TableToStream(Processor):
    kind = "to-stream"
    replay = replay_semantics.TO_STREAM

    def process(self, key, change, timestamp):
        self.forward(key, change.new, timestamp)


def reads_old_values(children) -> bool:
    """Whether a consumer among ``children`` (through pass-throughs) reads ``Change.old``: no
    when every path ends in a to_stream (exact types: a subclass might read it)."""
    for c in children:
        if type(c) is TableToStream:
            continue
        if type(c) is PassThrough and not reads_old_values(c.children):
            continue
        return True
    return False


def _has_internal(headers) -> bool:
    return any(h[0] in provenance.INTERNAL_HEADERS for h in headers)


def _without_internal(headers) -> list:
    """``headers`` without the internal ones (a new list)."""
    return [h for h in headers if h[0] not in provenance.INTERNAL_HEADERS]


class Sink(Processor):
    kind = "sink"
    replay = replay_semantics.SINK

    def __init__(self, name, topic, key_serde, value_serde, passthrough=False, internal=False,
                 route_like: str | None = None, carries_table: bool = False, extractor=None):
        super().__init__(name)
        # ``to(extractor)``: ``extractor(key, value)`` names each record's topic, which must exist
        # (``ProcessorContext.topic_exists``); else an OutputError under the on-error policy
        self.extractor = extractor
        self.carries_table = carries_table
        # route by the partitioner that placed this source topic (FK subscriptions: the right table's)
        self.route_like = route_like
        self.internal = internal
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.passthrough = passthrough
        self.records_out = 0

    def init(self, context):
        super().init(context)
        self._topic_bytes: dict[str, bytes] = {}   # the provenance header's topic part, per input topic

    def process(self, key, value, timestamp):
        ctx = self.context
        extra: Any
        partition, extra = None, ()
        if type(value) is Routed:
            value, partition, extra = value
        try:
            kb = self.key_serde.serialize(key)
        except Exception as exc:
            if is_operational(exc):   # not the record's (a registry outage): never rejects it
                raise
            raise OutputError(f"key serialization with {self.key_serde!r} for topic "
                                     f"{self.topic!r} failed: {type(exc).__name__}: {exc}", step=self.name) from exc
        if self.passthrough and value is ctx.source_value and self.value_serde is ctx.source_value_serde:
            vb = ctx.source_value_bytes
        else:
            try:
                vb = self.value_serde.serialize(value)
            except Exception as exc:
                if is_operational(exc):
                    raise
                raise OutputError(f"value serialization with {self.value_serde!r} for topic "
                                         f"{self.topic!r} failed: {type(exc).__name__}: {exc}", step=self.name) from exc
        self.records_out += 1
        if self.route_like is not None and partition is None:
            partition = ctx.routing.route(self.route_like, self.topic, kb)
        if self.internal:
            headers = ctx.headers
            if headers:
                headers = _without_internal(headers)
                headers.extend(extra)
            else:
                headers = list(extra)
            topic = ctx.topic
            if topic is not None:  # None only when hosted outside a Task
                tb = self._topic_bytes.get(topic)
                if tb is None:
                    tb = self._topic_bytes[topic] = topic.encode("utf-8")
                headers.append((provenance.HEADER, provenance.pack_head(provenance.VERSION, ctx.partition, ctx.offset,
                                                                        ctx.sequence) + tb))
                ctx.sequence += 1
            ctx.send_internal(self.topic, kb, vb, timestamp, headers or None, partition)
        else:
            headers = ctx.headers
            if headers and _has_internal(headers):  # not for user topics
                headers = _without_internal(headers)
            if self.carries_table and ctx.origin_head is not None:
                headers = [*headers, (provenance.ORIGIN_HEADER, ctx.origin())] if headers else \
                    [(provenance.ORIGIN_HEADER, ctx.origin())]
            topic = self.topic if self.extractor is None else self._extracted(key, value)
            ctx.send(topic, kb, vb, timestamp, headers)

    def _extracted(self, key, value) -> str:
        try:
            topic = self.extractor(key, value)
        except Exception as exc:
            raise self.user_error(self.extractor, exc) from exc
        if not isinstance(topic, str) or not topic:
            raise OutputError(f"the topic extractor {describe_function(self.extractor)} named no topic: it "
                              f"returned {topic!r}", step=self.name)
        if not self.context.topic_exists(topic):
            raise OutputError(f"the topic extractor {describe_function(self.extractor)} named topic {topic!r}, "
                              f"which does not exist (topics are not created for it)", step=self.name)
        return topic

    def metrics(self):
        return {"records_out": self.records_out}
