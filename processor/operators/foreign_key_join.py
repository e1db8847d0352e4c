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

Versions. A left row's version is the provenance of the left input record that produced it
(its topic, partition and offset, and the sequence number of the subscription it caused: the
``processor.source`` header that subscription carries; a punctuation's is synthetic, see
``Task._outside_record``). The left side keeps it per primary key in the version store (the
high-water mark); the right side stores it with the subscription and every response echoes it
(``processor.fk.subscription``). A response applies only if its echo is the key's current
version AND the foreign key it answers is the current row's; any response to an older left row
(the foreign key moved on, the row changed or was deleted) is dropped and counted in
``stale_responses_dropped``. So a response from the old foreign key's partition can never
overwrite the result for the new one, however partitions are scheduled. Versions are input
positions, not a counter: a replay after a crash gives a left change the same version whatever
order the task's inputs are replayed in, and a topology change cannot reset them.

What the left side resolves alone, at once (no round trip): a left delete (result: none), and a
left row with no foreign key (left join: ``joiner(left, None)``; inner: none). It then only
unsubscribes from the old foreign key. Otherwise it subscribes and the response decides.

Replays. Subscription and response records are applied idempotently, and neither topic is
deduplicated by provenance (``dedup=False`` on their sources). A left task that rolled back
after a crash re-sends subscriptions the right side has seen and needs their responses again;
a right task that rolled back may answer the same subscription again with a NEWER right row
(its two inputs interleave differently on replay), which must not be dropped. A right-side
replay can therefore briefly re-apply an older right row (at-least-once); the version check
keeps every response for an outdated left row out.

Timestamps: a result caused by a left change carries max(left, right) timestamps (a local
resolution: the left record's); one caused by a right change carries the right record's.
"""

from __future__ import annotations

import inspect

from processor import provenance
from processor.errors import ProcessingError, SerializationError
from processor.operators import replay as replay_semantics
from processor.operators.base import Processor, describe_function
from processor.operators.sink import Routed, Sink, reads_old_values
from processor.operators.table_join import MaterializedResult
from processor.operators.value_getter import table_getter
from processor.serde import subscription as wire
from processor.state import combined_key


def _corrupt(step, what, exc=None):
    """Our own internal records that do not decode are not user input to dead-letter: a replica
    of a newer build, or corruption. Stop loudly, whatever the error policy."""
    return ProcessingError(f"{what}: an internal record this build cannot read{f' ({exc})' if exc else ''}; "
                           f"stopping (internal topics are never dead-lettered)", step=step)


def extract_fk(step, fk_extractor, arity, right_key_serde, key, value):
    """The foreign key of a left row, in the right table's key bytes (None: no foreign key)."""
    if value is None:
        return None
    try:
        fk = fk_extractor(key, value) if arity == 2 else fk_extractor(value)
    except Exception as exc:
        raise step.user_error(fk_extractor, exc) from exc
    if fk is None:
        return None
    try:
        return right_key_serde.serialize(fk)
    except Exception as exc:
        raise SerializationError(f"the foreign key {fk!r} returned by {describe_function(fk_extractor)} "
                                 f"does not serialize with the right table's key serde {right_key_serde!r}: "
                                 f"{type(exc).__name__}: {exc}", step=step.name) from exc


def fk_extractor_arity(fn) -> int:
    """1 for ``fk(value)``, 2 for ``fk(key, value)``."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        return 1
    return 2 if len(params) >= 2 else 1


class _LeftSide(Processor):
    """An operator of the left (primary-key) side: it extracts foreign keys, applies the joiner,
    and keeps the version store and the result table (``open_stores``)."""

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
        self.unchanged_skipped = 0

    def open_stores(self, context, result_readers) -> None:
        """The version store and the result table (old values decoded only if one of
        ``result_readers`` reads them)."""
        self.versions = context.get_store(self.version_store_name)
        self.result = MaterializedResult(context.get_store(self.result_store_name), self.result_serde, self,
                                         send_old=reads_old_values(result_readers))


class ForeignKeyJoinSubscriptionSender(_LeftSide):
    """Left side: a left change -> subscriptions, or a result resolved locally."""

    kind = "fk-join-subscription-sender"
    replay = replay_semantics.FK_SUBSCRIPTION_SENDER

    def __init__(self, name, fk_extractor, left_key_serde, right_key_serde, joiner, how,
                 version_store, result_store, result_serde):
        super().__init__(name, fk_extractor, left_key_serde, right_key_serde, joiner, how,
                         version_store, result_store, result_serde)
        self.subscriptions_sent = 0
        self.unsubscriptions_sent = 0
        self.resolved_locally = 0

    def init(self, context):
        super().init(context)
        self.sinks = [c for c in self.children if isinstance(c, Sink)]
        self.results = [c for c in self.children if not isinstance(c, Sink)]
        self.open_stores(context, self.results)

    def _to_results(self, key, change, timestamp):
        for c in self.results:
            c.process(key, change, timestamp)

    def _fk(self, key, value):
        return extract_fk(self, self.fk_extractor, self.fk_arity, self.right_key_serde, key, value)

    def _version(self) -> bytes:
        """The provenance the next internal record sent now will carry (the sink stamps it)."""
        ctx = self.context
        topic, partition, offset = ctx.topic, ctx.partition, ctx.offset
        assert topic is not None and partition is not None and offset is not None, "sent while a record is in hand"
        return provenance.encode(topic, partition, offset, ctx.sequence)

    def _send(self, fkb, instruction, pk, ts):
        data = wire.encode_subscription(instruction, self.context.task_partition, pk)
        for s in self.sinks:
            s.process(fkb, data, ts)

    def process(self, key, change, timestamp):
        pk = self.serialize(self.left_key_serde, key, "key")
        new_fk = self._fk(key, change.new)
        old_fk = self._fk(key, change.old)
        if old_fk is not None and old_fk != new_fk:
            self._send(old_fk, wire.UNSUBSCRIBE, pk, timestamp)
            self.unsubscriptions_sent += 1
        if change.new is None:
            self.versions.delete(pk)
        else:
            self.versions.put(pk, wire.encode_left_version(self._version()))
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
                self.result.emit(self._to_results, key, out, timestamp)
            return
        if self.how == "left" or self.result.store.get(pk) is not None:
            instruction = wire.SUBSCRIBE_AND_RESPOND
        else:  # inner join with no result now: a "no right row" answer could change nothing
            instruction = wire.SUBSCRIBE_RESPOND_IF_PRESENT
        self._send(new_fk, instruction, pk, timestamp)
        self.subscriptions_sent += 1

    def metrics(self):
        return {"subscriptions_sent": self.subscriptions_sent, "unsubscriptions_sent": self.unsubscriptions_sent,
                "resolved_locally": self.resolved_locally, "unchanged_skipped": self.unchanged_skipped}


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

    def _respond(self, pk, partition, data, ts, echo):
        """``data``: ``wire.encode_response(fk, value bytes)`` (one for every subscriber of a row)."""
        self.forward(pk, Routed(data, partition, [(wire.ECHO_HEADER, echo)]), ts)
        self.responses_sent += 1


class ForeignKeyJoinSubscriptionReceiver(_RespondingOperator):
    """Right side: a subscription -> the subscription store, and a response with the right row."""

    kind = "fk-join-subscription-receiver"
    replay = replay_semantics.FK_SUBSCRIPTION_RECEIVER

    def __init__(self, name, right_node, subscription_store, right_key_serde, right_value_serde):
        super().__init__(name, subscription_store, right_key_serde, right_value_serde)
        self.right_node = right_node
        self.unsubscribed = 0

    def init(self, context):
        super().init(context)
        self.right = table_getter(self.right_node, context)

    def process(self, fkb, data, timestamp):
        if fkb is None:
            raise _corrupt(self.name, "a subscription record without a key")
        try:
            sub = wire.decode_subscription(data)
        except ValueError as exc:
            raise _corrupt(self.name, "a subscription record", exc) from exc
        ck = combined_key.encode(fkb, sub.pk)
        if sub.instruction == wire.UNSUBSCRIBE:
            self.subscriptions.delete(ck)
            self.unsubscribed += 1
            return
        echo = provenance.find(self.context.headers)
        if echo is None:
            raise _corrupt(self.name, f"a subscription record without its {provenance.HEADER} header")
        self.subscriptions.put(ck, wire.encode_subscriber(sub.primary_partition, echo))
        row = self.right.get(self.right_key_serde.deserialize(fkb), fkb)
        if row is None:
            if sub.instruction == wire.SUBSCRIBE_RESPOND_IF_PRESENT:
                return
            vb, ts = None, timestamp
        else:
            vb, ts = self.serialize(self.right_value_serde, row[0], "right value"), max(timestamp, row[1])
        self._respond(sub.pk, sub.primary_partition, wire.encode_response(fkb, vb), ts, echo)

    def metrics(self):
        return {"responses_sent": self.responses_sent, "unsubscribed": self.unsubscribed}


class ForeignKeyJoinResponder(_RespondingOperator):
    """Right side: a right row changed -> one response per subscriber of its key, found by a
    prefix scan of the subscription store, so in primary-key byte order."""

    kind = "fk-join-responder"
    replay = replay_semantics.FK_RESPONDER

    def process(self, key, change, timestamp):
        fkb = self.serialize(self.right_key_serde, key, "key")
        data = None   # encoded at the first subscriber (most right rows have none), once for all
        for ck, raw in self.subscriptions.prefix(combined_key.prefix(fkb)):
            if data is None:
                vb = None if change.new is None else self.serialize(self.right_value_serde, change.new, "value")
                data = wire.encode_response(fkb, vb)
            _, pk = combined_key.decode(ck)
            s = wire.decode_subscriber(raw)
            self._respond(pk, s.primary_partition, data, timestamp, s.echo)

    def metrics(self):
        return {"responses_sent": self.responses_sent}


class ForeignKeyJoinResponseResolver(_LeftSide):
    """Left side: a response -> the result for the left row it answers, if still current."""

    kind = "fk-join-response-resolver"
    replay = replay_semantics.FK_RESPONSE_RESOLVER

    def __init__(self, name, left_node, fk_extractor, left_key_serde, right_key_serde, right_value_serde,
                 joiner, how, version_store, result_store, result_serde):
        super().__init__(name, fk_extractor, left_key_serde, right_key_serde, joiner, how,
                         version_store, result_store, result_serde)
        self.left_node = left_node
        self.right_value_serde = right_value_serde
        self.stale_responses_dropped = 0

    def init(self, context):
        super().init(context)
        self.left = table_getter(self.left_node, context)
        self.open_stores(context, self.children)

    def process(self, pk, data, timestamp):
        if pk is None:
            raise _corrupt(self.name, "a response record without a key")
        try:
            resp = wire.decode_response(data)
        except ValueError as exc:
            raise _corrupt(self.name, "a response record", exc) from exc
        echo = None
        for name, value in self.context.headers or ():
            if name == wire.ECHO_HEADER:
                echo = value
        if echo is None:
            raise _corrupt(self.name, f"a response record without its {wire.ECHO_HEADER} header")
        raw = self.versions.get(pk)
        if raw is None or wire.decode_left_version(raw) != echo:
            self.stale_responses_dropped += 1
            return
        key = self.left_key_serde.deserialize(pk)
        row = self.left.get(key, pk)
        if row is None or extract_fk(self, self.fk_extractor, self.fk_arity, self.right_key_serde,
                                     key, row[0]) != resp.fk:
            # cannot happen while the version store is kept with the left table, unless a
            # replay produced a different row for the same input record: not this response's
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
            self.result.emit(self.forward, key, out, timestamp)

    def metrics(self):
        return {"stale_responses_dropped": self.stale_responses_dropped,
                "unchanged_skipped": self.unchanged_skipped}
