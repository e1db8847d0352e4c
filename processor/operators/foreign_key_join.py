"""Foreign-key table-table join (KIP-213): four small operators around two internal topics.

    left table --> ForeignKeyJoinSubscriptionSender --> subscription topic (keyed by fk)
                         |  (local results)                      |
                         v                                       v
    result table <-- ForeignKeyJoinResponseResolver   ForeignKeyJoinSubscriptionReceiver
                         ^                                       |  (+ right table lookup)
                         |                                       v
                  response topic (to the primary partition) <----+---- ForeignKeyJoinResponder
                                                                       ^ right table changes

Invariant: the join forwards exactly the changes of its result table, which is materialized:
every result goes through a compare-and-set on the result store (``MaterializedResult``), so no
duplicate tombstone, no tombstone for a key with no result and no re-emission of an unchanged
result is ever forwarded.

Versions. Every left change gets a version (a per-task sequence, committed with the task's
state, so a replay assigns the same numbers) kept per primary key in the version store; the
subscription carries it and every response echoes it. A response applies only if its version
is the key's current one: any response to an older left row (the foreign key moved on, the row
changed or was deleted) is dropped and counted in ``stale_responses_dropped``. So a response
from the old foreign key's partition can never overwrite the result for the new one, however
the two partitions are scheduled. Versions are sequence numbers rather than raw input offsets
because a left table's changes may come from several input partitions or from a punctuation;
the input offset itself travels in the ``processor.source`` header.

What the left side resolves alone, at once (no round trip): a left delete (result: none), and a
left row with no foreign key (left join: ``joiner(left, None)``; inner: none). It then only
unsubscribes from the old foreign key. Otherwise it subscribes and the response decides.

Replays. Subscriptions are applied idempotently (a put or delete of one CombinedKey, and a
response re-sent), and their topic is NOT deduplicated by provenance: a left task that rolled
back after a crash re-sends a subscription the right side has seen, and needs the response
again. Responses ARE deduplicated (an old response replayed after a newer one would revert the
result); the version check handles a response that overtook its (replayed) left row.

Timestamps: a result caused by a left change carries max(left, right) timestamps (a local
resolution: the left record's); one caused by a right change carries the right record's.
"""

from __future__ import annotations

import inspect
import struct

from processor import provenance
from processor.errors import DeserializationError
from processor.operators.base import Processor
from processor.operators.sink import Routed, Sink
from processor.operators.table_join import MaterializedResult
from processor.operators.value_getter import table_getter
from processor.serde import subscription as wire
from processor.state import combined_key
from processor.state.store import TASK_STORE

_COUNTER = struct.Struct(">q")


def fk_extractor_arity(fn) -> int:
    """1 for ``fk(value)``, 2 for ``fk(key, value)``."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        return 1
    return 2 if len(params) >= 2 else 1


class ForeignKeyJoinSubscriptionSender(Processor):
    """Left side: a left change -> subscriptions, or a result resolved locally."""

    kind = "fk-join-subscription-sender"

    def __init__(self, name, fk_extractor, left_key_serde, right_key_serde, joiner, how,
                 version_store, result_store, result_serde):
        super().__init__(name)
        self.fk_extractor = fk_extractor
        self.fk_arity = fk_extractor_arity(fk_extractor)
        self.left_key_serde = left_key_serde
        self.right_key_serde = right_key_serde
        self.joiner = joiner
        self.how = how
        self.version_store_name = version_store
        self.result_store_name = result_store
        self.result_serde = result_serde
        self._counter_key = b"fk_version\x00" + name.encode()
        self.subscriptions_sent = 0
        self.unsubscriptions_sent = 0
        self.resolved_locally = 0
        self.unchanged_skipped = 0

    def init(self, context):
        super().init(context)
        self.sinks = [c for c in self.children if isinstance(c, Sink)]
        self.results = [c for c in self.children if not isinstance(c, Sink)]
        self.versions = context.get_store(self.version_store_name)
        self.result = MaterializedResult(context.get_store(self.result_store_name), self.result_serde)
        self.task_store = context.get_store(TASK_STORE)
        raw = self.task_store.get(self._counter_key)
        self.version = 0 if raw is None else _COUNTER.unpack(raw)[0]

    def _fk(self, key, value):
        if value is None:
            return None
        try:
            fk = self.fk_extractor(key, value) if self.fk_arity == 2 else self.fk_extractor(value)
        except Exception as exc:
            raise self.user_error(self.fk_extractor, exc) from exc
        return None if fk is None else self.right_key_serde.serialize(fk)

    def _send(self, fkb, instruction, version, pk, ts):
        data = wire.encode_subscription(instruction, self.context.task_partition, version, pk)
        for s in self.sinks:
            s.process(fkb, data, ts)

    def process(self, key, change, timestamp):
        pk = self.left_key_serde.serialize(key)
        new_fk = self._fk(key, change.new)
        old_fk = self._fk(key, change.old)
        if change.new is None:
            self.versions.delete(pk)
        else:
            self.version += 1
            self.task_store.put(self._counter_key, _COUNTER.pack(self.version))
            self.versions.put(pk, wire.encode_left_version(self.version))
        if old_fk is not None and old_fk != new_fk:
            self._send(old_fk, wire.UNSUBSCRIBE, self.version, pk, timestamp)
            self.unsubscriptions_sent += 1
        if new_fk is None:
            # a deleted row, or a row without a foreign key: nothing to ask the right side
            self.resolved_locally += 1
            new = None
            if change.new is not None and self.how == "left":
                try:
                    new = self.joiner(change.new, None)
                except Exception as exc:
                    raise self.user_error(self.joiner, exc) from exc
            out = self.result.update(pk, new, timestamp)
            if out is None:
                self.unchanged_skipped += 1
            else:
                for c in self.results:
                    c.process(key, out, timestamp)
            return
        if self.how == "left" or self.result.store.get(pk) is not None:
            instruction = wire.SUBSCRIBE_AND_RESPOND
        else:  # inner join with no result now: a "no right row" answer could change nothing
            instruction = wire.SUBSCRIBE_RESPOND_IF_PRESENT
        self._send(new_fk, instruction, self.version, pk, timestamp)
        self.subscriptions_sent += 1

    def metrics(self):
        return {"subscriptions_sent": self.subscriptions_sent, "unsubscriptions_sent": self.unsubscriptions_sent,
                "resolved_locally": self.resolved_locally, "unchanged_skipped": self.unchanged_skipped,
                "left_version": self.version}


class _RespondingOperator(Processor):
    def __init__(self, name, subscription_store, right_key_serde, right_value_serde):
        super().__init__(name)
        self.subscription_store_name = subscription_store
        self.right_key_serde = right_key_serde
        self.right_value_serde = right_value_serde
        self.responses_sent = 0

    def init(self, context):
        super().init(context)
        self.subscriptions = context.get_store(self.subscription_store_name)

    def _respond(self, pk, partition, version, value_bytes, ts, echo):
        headers = [(wire.ECHO_HEADER, echo)] if echo else []
        self.forward(pk, Routed(wire.encode_response(version, value_bytes), partition, headers), ts)
        self.responses_sent += 1


class ForeignKeyJoinSubscriptionReceiver(_RespondingOperator):
    """Right side: a subscription -> the subscription store, and a response with the right row."""

    kind = "fk-join-subscription-receiver"

    def __init__(self, name, right_node, subscription_store, right_key_serde, right_value_serde):
        super().__init__(name, subscription_store, right_key_serde, right_value_serde)
        self.right_node = right_node
        self.unsubscribed = 0

    def init(self, context):
        super().init(context)
        self.right = table_getter(self.right_node, context)

    def process(self, fkb, data, timestamp):
        if fkb is None:
            raise DeserializationError("a subscription record needs a key (the foreign key)", step=self.name)
        try:
            sub = wire.decode_subscription(data)
        except ValueError as exc:
            raise DeserializationError(f"bad subscription record: {exc}", step=self.name) from exc
        ck = combined_key.encode(fkb, sub.pk)
        if sub.instruction == wire.UNSUBSCRIBE:
            self.subscriptions.delete(ck)
            self.unsubscribed += 1
            return
        echo = provenance.find(self.context.headers)
        self.subscriptions.put(ck, wire.encode_subscriber(sub.primary_partition, sub.version, echo))
        row = self.right.get(self.right_key_serde.deserialize(fkb), fkb)
        if row is None:
            if sub.instruction == wire.SUBSCRIBE_RESPOND_IF_PRESENT:
                return
            vb, ts = None, timestamp
        else:
            vb, ts = self.right_value_serde.serialize(row[0]), max(timestamp, row[1])
        self._respond(sub.pk, sub.primary_partition, sub.version, vb, ts, echo)

    def metrics(self):
        return {"responses_sent": self.responses_sent, "unsubscribed": self.unsubscribed}


class ForeignKeyJoinResponder(_RespondingOperator):
    """Right side: a right row changed -> one response per subscriber of its key, found by a
    prefix scan of the subscription store, so in primary-key byte order."""

    kind = "fk-join-responder"

    def process(self, key, change, timestamp):
        fkb = self.right_key_serde.serialize(key)
        vb = None if change.new is None else self.right_value_serde.serialize(change.new)
        for ck, raw in self.subscriptions.prefix(combined_key.prefix(fkb)):
            _, pk = combined_key.decode(ck)
            s = wire.decode_subscriber(raw)
            self._respond(pk, s.primary_partition, s.version, vb, timestamp, s.echo)

    def metrics(self):
        return {"responses_sent": self.responses_sent}


class ForeignKeyJoinResponseResolver(Processor):
    """Left side: a response -> the result for the left row it answers, if still current."""

    kind = "fk-join-response-resolver"

    def __init__(self, name, left_node, left_key_serde, right_value_serde, joiner, how,
                 version_store, result_store, result_serde):
        super().__init__(name)
        self.left_node = left_node
        self.left_key_serde = left_key_serde
        self.right_value_serde = right_value_serde
        self.joiner = joiner
        self.how = how
        self.version_store_name = version_store
        self.result_store_name = result_store
        self.result_serde = result_serde
        self.stale_responses_dropped = 0
        self.unchanged_skipped = 0

    def init(self, context):
        super().init(context)
        self.left = table_getter(self.left_node, context)
        self.versions = context.get_store(self.version_store_name)
        self.result = MaterializedResult(context.get_store(self.result_store_name), self.result_serde)

    def process(self, pk, data, timestamp):
        if pk is None:
            raise DeserializationError("a response record needs a key (the primary key)", step=self.name)
        try:
            resp = wire.decode_response(data)
        except ValueError as exc:
            raise DeserializationError(f"bad response record: {exc}", step=self.name) from exc
        raw = self.versions.get(pk)
        if raw is None or wire.decode_left_version(raw) != resp.version:
            self.stale_responses_dropped += 1
            return
        key = self.left_key_serde.deserialize(pk)
        row = self.left.get(key, pk)
        if row is None:  # cannot happen while the version store is kept with the left table
            self.stale_responses_dropped += 1
            return
        right = None if resp.value is None else self.right_value_serde.deserialize(resp.value)
        new = None
        if right is not None or self.how == "left":
            try:
                new = self.joiner(row[0], right)
            except Exception as exc:
                raise self.user_error(self.joiner, exc) from exc
        out = self.result.update(pk, new, timestamp)
        if out is None:
            self.unchanged_skipped += 1
        else:
            self.forward(key, out, timestamp)

    def metrics(self):
        return {"stale_responses_dropped": self.stale_responses_dropped,
                "unchanged_skipped": self.unchanged_skipped}
