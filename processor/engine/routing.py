"""Routing: which partitioner placed each source topic, and how records are sent by key.

Invariant: a host (worker, test driver, backfill) gives every Task one ``Routing``; the Task
checks the key of every record it consumes from a checked topic against the partitioner decided
for that topic (``PartitioningError``, exit 2, before anything is applied), and sinks that route
like a source (foreign-key subscriptions) pick the partition with the same partitioner. So a
record that would make a join silently wrong stops the worker instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.engine.partitioners import INTERNAL, Partitioner
from processor.errors import ConfigError


class PartitioningError(ConfigError):
    """A key is not where its topic's partitioner puts it, or co-partitioned inputs disagree
    (exit 2: the input or the topology must change, not the worker)."""


REMEDY = ("re-produce the topic with the partitioner the other side uses, declare the partitioner "
          "that wrote it (b.table/b.stream(topic, partitioner=...)), or let the topology repartition "
          "it (repartition=True on the source)")
# A topic that foreign-key subscriptions are routed by: its partitioner is recorded at the
# application's first start, because the subscriptions already stored sit where it put them.
REMEDY_ROUTED = ("this application has routed foreign-key subscriptions by that partitioner since its "
                 "first start (recorded in its <application-id>-partitioning topic): re-produce the topic "
                 "with it, or reset the application (delete its state directories, its internal, changelog "
                 "and -partitioning topics and its group offsets) to route by another")


@dataclass(frozen=True)
class PartitionerChoice:
    """The partitioner of one source topic and how it was decided."""

    topic: str
    partitioner: Partitioner
    how: str              # "declared" | "detected from N sampled keys" | "default: ..." | ...
    checked: bool = True  # keys are checked as they are consumed
    routes: bool = False  # foreign-key subscriptions are routed by it (recorded, never changes)

    def __str__(self):
        return f"{self.partitioner.name} ({self.how}{'; checked as consumed' if self.checked else ''})"


ROUTE_CACHE_ENTRIES = 1 << 16


class Routing:
    def __init__(self, choices: dict[str, PartitionerChoice] | None = None,
                 partition_counts: dict[str, int] | None = None):
        self.choices = dict(choices or {})
        self.partition_counts = dict(partition_counts or {})
        # (like topic, sink topic, key) -> partition: foreign keys repeat (many left rows per
        # right key), and the partitioners are pure Python
        self._routes: dict[tuple[str, str, bytes], int] = {}

    def partitioner_of(self, topic: str) -> Partitioner:
        choice = self.choices.get(topic)
        return INTERNAL if choice is None else choice.partitioner

    def route(self, like_topic: str, sink_topic: str, key: bytes) -> int | None:
        """The partition of ``sink_topic`` that ``key`` goes to under ``like_topic``'s partitioner
        (None where the host has no partition count: a one-partition host such as the driver)."""
        ck = (like_topic, sink_topic, key)
        p = self._routes.get(ck)
        if p is None:
            n = self.partition_counts.get(sink_topic)
            if n is None:
                return None
            p = self.partitioner_of(like_topic).partition(key, n)
            if len(self._routes) >= ROUTE_CACHE_ENTRIES:
                self._routes.clear()
            self._routes[ck] = p
        return p

    def checks(self, topics) -> dict[str, tuple[Partitioner, int, PartitionerChoice]]:
        """``{topic: (partitioner, partition count, choice)}`` for the checked topics among ``topics``."""
        out = {}
        for t in topics:
            c = self.choices.get(t)
            n = self.partition_counts.get(t, 1)
            if c is not None and c.checked and n > 1:
                out[t] = (c.partitioner, n, c)
        return out


PLACEMENT_CACHE = 100_000   # keys per checked topic whose placement is remembered


class KeyPlacementCheck:
    """Every consumed key of a checked topic must be where its topic's partitioner puts it (one
    hash per new key: table keys repeat, so a bounded cache of placements saves most of them).
    ``topics``: ``{topic: (partitioner, partition count, choice, cache)}``, empty when no topic
    is checked."""

    __slots__ = ("topics",)

    def __init__(self, checks: dict[str, tuple[Partitioner, int, PartitionerChoice]]):
        self.topics: dict[str, tuple[Partitioner, int, PartitionerChoice, dict[bytes, int]]] = {
            t: (*c, {}) for t, c in checks.items()}

    def check(self, topic: str, partition: int, offset, key: bytes) -> None:
        """Raise ``PartitioningError`` for a key of ``topic[partition]`` its partitioner puts elsewhere."""
        p, n, choice, cache = self.topics[topic]
        expected = cache.get(key)
        if expected is None:
            if not p.places(key):
                return
            expected = p.partition(key, n)
            if len(cache) >= PLACEMENT_CACHE:
                cache.clear()
            cache[key] = expected
        if expected != partition:
            raise misplaced_key(topic, partition, offset, key, expected, choice)


def misplaced_key(topic: str, partition: int, offset, key: bytes, expected: int,
                  choice: PartitionerChoice) -> PartitioningError:
    return PartitioningError(
        f"key {key!r} at {topic}[{partition}]@{offset} is in partition {partition}, but partitioner "
        f"{choice.partitioner.name} ({choice.how}) puts it in partition {expected}: joins over this "
        f"topic would be silently wrong; {REMEDY_ROUTED if choice.routes else REMEDY}")


def _unexplained(topic: str, n: int, keyed) -> PartitioningError:
    """No known partitioner places every sampled key: name the record at which the last
    candidate failed (a key no family explains, or keys that need different families)."""
    from processor.engine.partitioners import KNOWN

    left = list(KNOWN)
    for k, part, off in keyed:
        fits = [p for p in left if not p.places(k) or p.partition(k, n) == part]
        if not fits:
            where = ", ".join(f"{x.name} -> {x.partition(k, n)}" for x in KNOWN)
            also = "" if len(left) == len(KNOWN) else \
                f" (the keys before it fit only {'/'.join(p.name for p in left)}: written by several partitioners?)"
            return PartitioningError(
                f"no known partitioner explains where the keys of topic {topic} are: key {k!r} at "
                f"{topic}[{part}]@{off} ({where}){also}; joins over it cannot be routed; declare its "
                f"partitioner (b.table/b.stream(topic, partitioner=...)) if it is another, or let the "
                f"topology repartition it (repartition=True on the source)")
        left = fits
    raise AssertionError("_unexplained called with keys some partitioner explains")


def _fmt(topic: str, cands, how: dict[str, str]) -> str:
    names = "/".join(p.name for p in cands)
    return f"{topic} ({names}, {how[topic]})"


def decide_partitioners(topology, partition_counts: dict[str, int],
                        samples: dict[str, list[tuple[bytes | None, int, int]]],
                        recorded: dict[str, str] | None = None) -> dict[str, PartitionerChoice]:
    """Decide the partitioner of every source topic that a result depends on
    (``topology.partitioning_relevant_topics()``) from declarations and ``samples`` (``{topic:
    [(key, partition, offset)]}``, the first records of each partition), then make co-partitioned
    join inputs agree. Raises ``PartitioningError`` (exit 2) when a declared partitioner
    contradicts the data, when no known partitioner explains a topic's keys, or when
    co-partitioned inputs are placed by different partitioners.

    ``recorded``: the partitioner each topic that routes foreign-key subscriptions was given at the
    application's first start (``processor/kafka/partitioning.py``); it is kept, as a
    declaration is, and a declaration or data that contradicts it is refused."""
    from processor.engine.partitioners import KNOWN, explaining, resolve

    relevant = topology.partitioning_relevant_topics()
    declared = dict(topology.declared_partitioners())
    routed = {t for like in topology.routed_by_source().values() for t in like}
    for t, fam in (recorded or {}).items():
        if t not in relevant:
            continue
        if t in declared and resolve(declared[t]).name != fam:
            remedy = REMEDY_ROUTED.replace('that partitioner', f'partitioner {fam}', 1)
            raise PartitioningError(f"topic {t} is declared with partitioner {declared[t]!r}, but {remedy}")
        declared[t] = fam
    cands: dict[str, list[Partitioner]] = {}
    how: dict[str, str] = {}
    for t in relevant:
        n = partition_counts[t]
        keyed = [(k, p, off) for k, p, off in samples.get(t, ()) if k is not None]
        if t in declared:
            p = resolve(declared[t])
            if n > 1:
                for k, part, off in keyed:
                    if p.places(k) and (exp := p.partition(k, n)) != part:
                        raise misplaced_key(t, part, off, k, exp, PartitionerChoice(
                            t, p, "recorded at the application's first start" if t in (recorded or {})
                            else f"declared as {declared[t]!r}", routes=t in (recorded or {})))
            cands[t], how[t] = [p], ("recorded at the application's first start" if t in (recorded or {})
                                     else "declared")
        elif n == 1:
            cands[t], how[t] = list(KNOWN), "one partition: every partitioner places keys alike"
        elif not keyed:
            cands[t], how[t] = list(KNOWN), "default: the topic held no keyed record at start"
        else:
            found = explaining([(k, p) for k, p, _ in keyed], n)
            if not found:
                raise _unexplained(t, n, keyed)
            cands[t] = found
            how[t] = f"detected from {len(keyed)} sampled keys"
    internal = {n.source_topic for n in topology.nodes if n.source_topic and n.attrs.internal}
    for t in internal:
        cands[t], how[t] = [INTERNAL], "internal topic"
    # co-partitioned inputs: narrow to the partitioners every side admits, to a fixed point
    constraints = topology.copartition_constraints()
    changed = True
    while changed:
        changed = False
        for name, left, right in constraints:
            topics = [t for t in left + right if t in cands]
            common = [p for p in KNOWN if all(p in cands[t] for t in topics)]
            if not common:
                raise PartitioningError(
                    f"{name} joins {', '.join(_fmt(t, cands[t], how) for t in left)} with "
                    f"{', '.join(_fmt(t, cands[t], how) for t in right)}: co-partitioned inputs must be "
                    f"placed by one partitioner, or equal keys meet on different partitions; {REMEDY}")
            for t in topics:
                if cands[t] != common:
                    others = ", ".join(x for x in topics if x != t)
                    how[t] = f"{how[t]}; narrowed by {name} to what {others} admits"
                    cands[t] = common
                    changed = True
    return {t: PartitionerChoice(t, cands[t][0], how[t], checked=partition_counts[t] > 1, routes=t in routed)
            for t in relevant}
