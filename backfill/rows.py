"""Rows: what a backfill task reads and sends, and the order it processes them in.

A row (``Row``: ``kind, topic, partition, key, value, timestamp, headers, origin, seq, phase``, a
plain tuple whose fields ``KIND``...``PHASE`` name by position) is
an ``input`` record of a source partition (``seq`` its offset) or an ``internal`` record a task
sent to an internal topic (``origin`` the sending task, ``seq`` its send order, ``phase`` 1 for
what a commit or flush sent after the run's records); ``timestamp`` in ms. Between runs, internal rows travel as
Spark data (``backfill.runs``): one pickled list per (run, destination topic partition, origin
task), in send order.

Invariants: a task's internal records are routed exactly as the worker's producer routes them
(the sink's explicit partition, else murmur2 of the key); ``merge`` keeps each stream's order
(a source partition in offset order; one origin's records to one partition in send order, runs
in run order) and across streams takes phase 0 before phase 1, then the lowest timestamp
(ties: topic, partition, origin), as a Kafka Streams task picks among its inputs.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Iterator

from backfill.items import ResultItem, RowsBatch
from processor.engine.record_order import next_record_key

ROW_FIELDS = ["kind", "topic", "partition", "key", "value", "ts", "headers", "origin", "seq", "phase"]
OUTPUT_FIELDS = ROW_FIELDS + ["run"]


# A row is a plain tuple (built, pickled between runs and read at a tuple's cost: a named tuple
# pickled 8x slower, measured on 300,000 rows); these name its fields by position.
KIND, TOPIC, PARTITION, KEY, VALUE, TIMESTAMP, HEADERS, ORIGIN, SEQ, PHASE = range(10)
Row = tuple   # (kind, topic, partition, key, value, timestamp, headers, origin, seq, phase)


class RowCollector:
    """A backfill task's collector: internal records become rows for the tasks that read them
    (partition as the worker's producer picks it), everything else an output row."""

    def __init__(self, ctx, task_id, run_no):
        from processor.engine.fk_join_coalescing import pair_of
        from processor.engine.partitioners import INTERNAL

        self.ctx = ctx
        self.internal_partitioner = INTERNAL
        self.origin = task_id
        self.run_no = run_no
        self.internal: dict[tuple[str, int], list] = {}   # (topic, partition) -> rows, in send order
        self.outputs: dict[str, list] = {k: [] for k in OUTPUT_FIELDS}   # columns of the output rows
        self.seq = 0
        self.phase = 0
        self.internal_counts: dict[str, int] = {}
        # a foreign-key join record's pair -> (rows, index) of this run's latest record of that
        # pair (see ``_supersede``)
        self._latest: dict[tuple, tuple[list, int]] = {}
        self.superseded = 0
        self._pair_of = pair_of
        self._partitions: dict[tuple[str, bytes], int] = {}   # (internal topic, key) -> partition

    def send(self, topic, key, value, timestamp, headers, partition=None):
        if topic in self.ctx.internal:
            if partition is None:
                if key is None:
                    partition = 0
                else:   # (keys repeat: group-by keys above all)
                    partition = self._partitions.get((topic, key))
                    if partition is None:
                        if len(self._partitions) >= 1 << 16:
                            self._partitions.clear()
                        partition = self._partitions[(topic, key)] = self.internal_partitioner.partition(
                            key, self.ctx.counts[topic])
            rows = self.internal.get((topic, partition))
            if rows is None:
                rows = self.internal[(topic, partition)] = []
            kind = self.ctx.fk_topics.get(topic)
            if kind is not None:
                self._supersede(self._pair_of(kind, topic, key, value, headers, partition), topic, rows)
            self.internal_counts[topic] = self.internal_counts.get(topic, 0) + 1
            rows.append(("internal", topic, partition, key, value, timestamp, list(headers) if headers else None,
                         self.origin, self.seq, self.phase))
            self.seq += 1
            return
        if topic != self.ctx.dlq and not self.ctx.emit_outputs:
            return   # a sink record: written only with --emit-outputs
        r = self.outputs
        r["kind"].append("output")
        r["topic"].append(topic)
        r["partition"].append(partition)
        r["key"].append(key)
        r["value"].append(value)
        r["ts"].append(timestamp)
        r["headers"].append(None if not headers else [{"key": k, "value": v} for k, v in headers])
        r["origin"].append(self.origin)
        r["seq"].append(self.seq)
        r["phase"].append(self.phase)
        r["run"].append(self.run_no)
        self.seq += 1

    def _supersede(self, pair, topic, rows) -> None:
        """A foreign-key join record supersedes this run's earlier one of the same pair, which is
        then not sent: the worker's rule within a commit interval
        (``processor/engine/fk_join_coalescing.py`` says why the join ends the same). A pair is a
        subscription's (partition, foreign key, primary key): the subscription store takes the
        last instruction, and the earlier one's answer would be stale; or a response's
        (partition, primary key, echo): both answer the same left version, the later with the
        right row as it is later. With a run's subscriptions all sent before their responses,
        this leaves a consumer of the join's results one result per left row and run (the
        current version's, with the right row as the run left it): what lets the compaction
        rule reduce the tables of a join whose results are aggregated (``backfill.compaction``).
        Neither topic is deduplicated by provenance, so no high-water mark misses a record."""
        if pair is None:
            return   # not ours to judge: the reader stops on it
        prev = self._latest.get(pair)
        if prev is not None:
            prev_rows, i = prev
            prev_rows[i] = None
            self.internal_counts[topic] -= 1
            self.superseded += 1
        self._latest[pair] = (rows, len(rows))

    def items(self, partition: int) -> list[ResultItem]:
        """What the run leaves for others, as items of the run's result (``backfill.runs``):
        ``("rows", destination partition, RowsBatch)`` per internal topic partition written, and
        ``("output", partition, Arrow IPC bytes)`` for the output rows (sinks with
        ``--emit-outputs``, dead letters always)."""
        out = []
        for (topic, part), rows in self.internal.items():
            if self.superseded:
                rows = [r for r in rows if r is not None]
            if rows:
                out.append(ResultItem("rows", part, RowsBatch(self.run_no, topic, self.origin,
                                                              pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))))
        if self.outputs["kind"]:
            import pyarrow as pa

            table = pa.Table.from_pydict(self.outputs, schema=output_schema())
            step = max(1, int(self.ctx.item_bytes // max(1, table.nbytes / max(1, table.num_rows))))
            for start in range(0, table.num_rows, step):   # (each blob about item_bytes at most)
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table.slice(start, step))
                out.append(ResultItem("output", partition, sink.getvalue().to_pybytes()))
        return out

    def flush(self):
        pass


_OUTPUT_ARROW = None


def output_schema():
    """The Arrow schema of output rows (``OUTPUT_FIELDS``)."""
    import pyarrow as pa

    global _OUTPUT_ARROW
    if _OUTPUT_ARROW is None:
        _OUTPUT_ARROW = pa.schema([
            ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("key", pa.binary()),
            ("value", pa.binary()), ("ts", pa.int64()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("origin", pa.string()), ("seq", pa.int64()), ("phase", pa.int32()), ("run", pa.int32())])
    return _OUTPUT_ARROW


def message_row(m):
    """A confluent-kafka Message -> an input row."""
    return ("input", m.topic(), m.partition(), m.key(), m.value(), m.timestamp()[1], m.headers() or None,
            "", m.offset(), 0)


def input_rows(batch):
    """Arrow rows of the Spark kafka schema -> task rows (kind, topic, partition, key, value,
    timestamp ms, headers, origin, seq = offset, phase)."""
    import pyarrow as pa

    n = batch.num_rows
    if not n:
        return []
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    topic = batch.column("topic")[0].as_py()
    part = batch.column("partition")[0].as_py()
    offsets = batch.column("offset").to_pylist()
    # epoch milliseconds whatever unit the Parquet file holds (Spark writes INT96 by default,
    # which Arrow reads as nanoseconds; TIMESTAMP_MICROS as microseconds)
    col = batch.column("timestamp")
    ts = col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64()).to_pylist()
    headers = batch.column("headers")
    hs = [None] * n if headers.null_count == n else [
        None if h is None else [(x["key"], x["value"]) for x in h] for h in headers.to_pylist()]
    return [("input", topic, part, keys[i], values[i], ts[i], hs[i], "", offsets[i], 0) for i in range(n)]


def merge(streams: dict, event_time=None) -> Iterator:
    """A task's rows of one run, from ``{(phase, topic, partition, origin): [rows in stream
    order]}``: each stream as it came; across streams phase 0 before phase 1 (records of a
    flush), then ``next_record_key`` (``processor/engine/record_order.py``: the lowest timestamp
    first, ties by topic and partition), then the origin. ``event_time``
    (``Task.event_time``, for a task with timestamp extractors): the time an input row is
    ordered by, as the worker's ``PartitionGroup`` orders it."""
    def time_of(r):
        ts = r[TIMESTAMP] if r[TIMESTAMP] is not None else 0
        return ts if event_time is None or r[KIND] != "input" else event_time(r[TOPIC], r[KEY], r[VALUE], ts)

    heap = []
    for key, rs in streams.items():
        if rs:
            heap.append((key[0], next_record_key(time_of(rs[0]), key[1], key[2]), key[3], 0))
    heapq.heapify(heap)
    while heap:
        phase, (_, topic, part), origin, i = heapq.heappop(heap)
        rs = streams[(phase, topic, part, origin)]
        yield rs[i]
        if i + 1 < len(rs):
            heapq.heappush(heap, (phase, next_record_key(time_of(rs[i + 1]), topic, part), origin, i + 1))


def add_stream_rows(streams: dict, rows) -> None:
    """Append ``rows`` (one stream's, in its order) to ``streams`` by (phase, topic, partition,
    origin)."""
    for r in rows:
        key = (r[PHASE], r[TOPIC], r[PARTITION], r[ORIGIN])
        s = streams.get(key)
        if s is None:
            s = streams[key] = []
        s.append(r)
