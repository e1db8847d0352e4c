"""Foreign-key join records held until the commit, a later one replacing an earlier.

Invariant: of the records a task sends to a foreign-key join's internal topics between two
commits, only the LAST for each pair goes out, in the place of its own send; every other record
passes through at once, untouched. A pair is

- on a subscription topic: (partition, foreign key, primary key);
- on a response topic: (partition, primary key, echo), the echo being the subscription it
  answers (the left version, header ``processor.fk.subscription``).

Records reach the coalescer only once the input record that caused them has been processed (a
failed record's sends never do), and everything held goes out before the commit that records
their input positions (``Task.prepare_commit``), so a crash loses nothing that a replay does not
send again.

Why the join ends the same without the records left out:

(The backfill applies the same rule to both topics within a run: ``backfill/rows.py``
``RowCollector._supersede``.)

- Subscriptions: a later record for the same pair overwrites the subscription
  store entry (subscribe) or deletes it (unsubscribe), whatever the earlier record did; and the
  response the earlier one would cause answers a left version that is no longer current (the
  later left change of that primary key caused the later record and holds the version store),
  so the resolver would drop it as stale.
- Responses: both answer the same subscription (one left version, one foreign key), the later
  with the right row as it is later. The resolver applies each to the left row if that version
  is still current, and the later one's result replaces the earlier's; if the left row moved on
  in between, the later one is dropped and the newer version's own response decides.

Neither topic is deduplicated by provenance: no high-water mark misses the records left out.
What is lost is intermediate results only, as with Kafka Streams' record caches.

What it saves: under a backlog, a left key updated k times within a commit interval costs one
round trip instead of k (and k-1 stale responses less); a right key updated k times sends each
subscriber one response instead of k. What it costs: these records wait for the commit (at most
``commit_interval_ms``, or until ``max_held`` records are held: then all go out).
"""

from __future__ import annotations

from processor.serde import subscription as wire

DEFAULT_MAX_HELD = 50_000
SUBSCRIPTIONS = "subscription"
RESPONSES = "response"


def _echo(headers):
    for name, value in headers or ():
        if name == wire.ECHO_HEADER:
            return value
    return None


def pair_of(kind, topic, key, value, headers, partition):
    """The pair a record of a foreign-key join's internal topic of ``kind`` belongs to; None: not
    a record this build writes (not ours to judge: its reader stops on it)."""
    which = wire.subscription_pk(value) if kind == SUBSCRIPTIONS else _echo(headers)
    return None if which is None else (topic, partition, key, which)


class ForeignKeyJoinRecordCoalescer:
    """A task's sender (``send`` as a collector's) for its foreign-key join internal topics
    ``{topic: SUBSCRIPTIONS or RESPONSES}``; other records pass through."""

    __slots__ = ("topics", "collector", "held", "max_held", "coalesced")

    def __init__(self, topics: dict[str, str], collector, max_held: int = DEFAULT_MAX_HELD):
        self.topics = dict(topics)
        self.collector = collector
        self.held: dict[tuple, tuple] = {}    # (topic, partition, key, pk or echo) -> the latest record
        self.max_held = max_held
        self.coalesced = dict.fromkeys(self.topics, 0)   # per topic: records left out, a later one replaced them

    def send(self, topic, key, value, timestamp, headers, partition=None) -> None:
        kind = self.topics.get(topic)
        if kind is None:
            self.collector.send(topic, key, value, timestamp, headers, partition)
            return
        pair = pair_of(kind, topic, key, value, headers, partition)
        if pair is None:
            self.flush()
            self.collector.send(topic, key, value, timestamp, headers, partition)
            return
        held = self.held
        if held.pop(pair, None) is not None:
            self.coalesced[topic] += 1
        held[pair] = (topic, key, value, timestamp, headers, partition)
        if len(held) >= self.max_held:
            self.flush()

    def supersede(self, records: list) -> list:
        """The same rule over a list of records to send (a task's outbox at its commit: internal
        records sent outside an input record, behind one that was, or staged until the commit):
        ``records`` without each one that a later one of the same pair follows, the others in
        their order."""
        topics = self.topics
        last: dict[tuple, int] = {}   # pair -> the index of its last record
        superseded = []
        for i, r in enumerate(records):
            kind = topics.get(r[0])
            if kind is not None:
                pair = pair_of(kind, r[0], r[1], r[2], r[4], r[5])
                if pair is not None:
                    if pair in last:
                        superseded.append(last[pair])
                        self.coalesced[r[0]] += 1
                    last[pair] = i
        if not superseded:
            return records
        drop = set(superseded)
        return [r for i, r in enumerate(records) if i not in drop]

    def flush(self) -> None:
        """Send every held record, in the order of their (last) sends."""
        if self.held:
            send = self.collector.send
            for r in self.held.values():
                send(*r)
            self.held.clear()
