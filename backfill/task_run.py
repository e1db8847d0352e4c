"""In an executor: one run of one sub-topology for one task, and the final write of a task that
no run wrote.

A run's Spark partition ``i`` is task ``i`` of the sub-topology (``backfill.runs``). What reaches
it: its stores as the task's previous run left them (a ``"state"`` item) and the internal rows
earlier runs addressed to it (``"rows"`` items: ``backfill.items``); it reads its own input
partitions' history from Kafka itself (Kafka partition i is task i). What it yields is the run's
result (``ResultItem``): ``"stats"``, ``"state"`` for its next run, ``"rows"`` for other tasks
(partition ``j``: the destination), ``"output"`` for the outputs, and in its last run ``"db"``
when the driver builds databases. How they travel depends on the master (``backfill.passage``:
Spark data, or a ``local`` master's files under the build root, where only the stats are
yielded).

Invariant: a task processes its history and its internal rows as the worker's task would
(``backfill.rows.merge``), with the topology's own ``Task``; the bytes it leaves are all it
carries between runs (``backfill/task_state.py``). Big payloads travel in pieces
(``backfill/pieces.py``); a run can be profiled (``backfill/profiling.py``).
"""

from __future__ import annotations

import gc
import logging
import pickle
import time

from backfill.context import error_info, executor_logging
from backfill.items import ResultItem, TaskStats
from backfill.profiling import dump_profile, profiler
from backfill.rows import SEQ, TIMESTAMP
from backfill.task_state import decode_state, encode_state
from processor.engine.task_id import TaskId

log = logging.getLogger("processor.backfill")

class TaskRun:
    """One run of one sub-topology (``mapPartitionsWithIndex``): partition ``i`` is task ``i``."""

    def __init__(self, ctx, spec):
        self.ctx = ctx
        self.spec = spec

    def __call__(self, partition, items):
        from processor.errors import ProcessorError

        executor_logging(self.ctx.log_level, getattr(self.ctx, "log_json", False))
        state, rows = self.ctx.passage.task_inputs(self.spec.sub, partition, self.spec.pending, self.spec.reads,
                                                   items)
        # No cyclic garbage collection during a run: the task's rows and stores are hundreds of
        # thousands of live objects that every full collection would walk again (measured: the
        # runs of benchmarks/backfill.py took 15 % longer with it); what a run leaves is
        # collected once it is over.
        prof = None
        gc.disable()
        try:
            prof = profiler()
            return self._run_task(partition, state, rows)
        except ProcessorError as exc:   # back to the driver as data: Spark would wrap it
            return [ResultItem("stats", partition, {"error": error_info(exc)})]
        finally:
            gc.enable()
            if prof is not None:
                dump_profile(prof, f"run{self.spec.run_no}-{self.spec.sub}_{partition}.prof")

    def _run_task(self, partition, state, row_items, compact=True, journal=False):
        from backfill.handoff import write_task
        from backfill.rows import RowCollector, merge
        from processor._compiled import build_info
        from processor.engine.task import Task, max_record_bytes_of

        ctx, spec = self.ctx, self.spec
        task_id = str(TaskId(spec.sub, partition))
        started = time.monotonic()
        streams, read, replayed = self._input(partition, row_items, compact)
        t_read = time.monotonic()
        stores, offsets = decode_state(state)
        collector = RowCollector(ctx, task_id, spec.run_no)
        task = Task(ctx.topo, spec.sub, partition, stores, collector, lambda: int(time.time() * 1000),
                    on_error=ctx.on_error, dlq_topic=ctx.dlq, routing=ctx.routing,
                    max_record_bytes=max_record_bytes_of(ctx.producer_config), journal=journal,
                    topic_exists=ctx.counts.__contains__,   # the topics at the snapshot
                    global_stores=ctx.global_stores())
        n = 0
        for kind, topic, part, key, value, ts, headers, _origin, seq, _phase in merge(
                streams, task.event_time if task.extracts_time else None):
            if kind == "input":
                offset = seq
            else:   # a shuffled internal record: offsets of its (virtual) partition, in arrival order
                offset = offsets.get((topic, part), 0)
                offsets[(topic, part)] = offset + 1
            task.process(topic, part, offset, ts, key, value, headers)
            n += 1
        failed = task.failed_in_processing
        if failed and not journal:
            # A record failed in a user function or an output (under fail, the task raised). The
            # first run keeps no journal to undo a failed record's writes and holds no outputs (a
            # cost on every write): run the task again with them. (Where tables were reduced,
            # the driver then processes the whole history again, record by record: see job.run.)
            log.warning("task %s: %d record(s) failed in processing (%s): running it again", task_id,
                        sum(failed.values()), ", ".join(f"{t}: {c}" for t, c in sorted(failed.items())))
            task.close()
            return self._run_task(partition, state, row_items, compact=compact, journal=True)
        if spec.flush:
            task.flush()
        # settle the outbox (records sent outside an input record) as a commit would: its records
        # go out now, after everything the run processed (phase 1), and the outbox entry is deleted
        pos, outbox = task.prepare_commit()
        collector.phase = 1
        task.finish_commit(pos, outbox)
        pos, _ = task.prepare_commit()
        task.finish_commit(pos, [])
        t_process = time.monotonic()
        task.close()
        out = collector.items(partition)
        stats: TaskStats = {"task": task_id, "records": n, "read": read, "replayed": replayed,
                            "internal": collector.internal_counts, "superseded": collector.superseded,
                            "dead_lettered": task.dead_lettered, "failed": dict(task.failed_in_processing),
                            "entries": {}, "unordered": self.unordered}
        stats["outputs"] = sum(1 for item in out if item.kind == "output")
        stats["build"] = build_info()   # (compiled, or the pure-Python fallback: the report says)
        if spec.final:
            written = write_task(ctx, spec.sub, partition, stores, time.monotonic())
            stats["entries"] = written["entries"]
            stats["built"] = written.get("built", 0)
            if "db" in written:
                out.append(ResultItem("db", partition, written["db"]))
                stats["db"] = len(written["db"])
        else:
            out.append(ResultItem("state", partition, encode_state(stores, offsets)))
        out = ctx.passage.keep(spec.run_no, task_id, out)
        stats["seconds"] = {"read": t_read - started, "process": t_process - t_read,
                            "write": time.monotonic() - t_process}
        out.append(ResultItem("stats", partition, stats))
        return out

    def _input(self, partition, row_items, compact=True):
        """``(streams, rows read, rows replayed)``: the task's history (archived rows below each
        range, then Kafka's, each partition in offset order; compactable tables reduced, but a
        partition whose timestamps go backwards is replayed whole) and the internal rows of the
        pending runs (in run order), as streams for ``merge``."""
        from backfill.compaction import in_time_order, last_changes, last_changes_of_messages
        from backfill.progress import RowCounter
        from backfill.range_reader import Range, iter_range
        from backfill.rows import add_stream_rows, input_rows, message_row

        ctx, spec = self.ctx, self.spec
        streams: dict = {}
        read, replayed = 0, 0
        unordered = self.unordered = []   # compacted partitions whose timestamps go backwards
        counter = RowCounter(ctx.progress_dir(spec.run_no), str(TaskId(spec.sub, partition)))

        def counted(batches):
            for msgs in batches:
                counter.add(len(msgs))
                yield msgs

        compacted = ctx.compacted if compact else ()
        for (topic, part), (start, end) in sorted(spec.external.items()):
            if part != partition:
                continue
            split = Range(topic, part, start, end)
            name = f"{topic}[{part}]"
            if topic in compacted:
                src = ctx.topo.source_node(topic).attrs
            if topic in compacted and topic not in spec.archives:
                # the common case, streamed: keep only each key's last two real changes
                n, got = last_changes_of_messages(
                    counted(iter_range(ctx.bootstrap_servers, split, spec.consumer_config)),
                    src.key_serde, src.value_serde)
                if got is not None:
                    read += n
                    replayed += len(got)
                    add_stream_rows(streams, got)
                    continue
                unordered.append(name)   # read again, every record replayed
            got = []
            if topic in spec.archives:
                import pyarrow.compute as pc
                import pyarrow.dataset as ds

                arch = ds.dataset(spec.archives[topic], format="parquet")
                flt = (pc.field("topic") == topic) & (pc.field("partition") == part) & (pc.field("offset") < start)
                for b in arch.to_batches(filter=flt):
                    got.extend(input_rows(b))
                    counter.add(b.num_rows)
            batches = iter_range(ctx.bootstrap_servers, split, spec.consumer_config)
            if name not in unordered:   # (a partition read again is counted once)
                batches = counted(batches)
            for msgs in batches:
                for m in msgs:
                    got.append(message_row(m))
            got.sort(key=lambda r: r[SEQ])
            read += len(got)
            if topic in compacted and name not in unordered:
                if not got or in_time_order([r[TIMESTAMP] or 0 for r in got]):   # (as merge takes a missing one)
                    got = last_changes(got, src.key_serde, src.value_serde)
                else:
                    unordered.append(name)
            replayed += len(got)
            add_stream_rows(streams, got)
        for batch in row_items:
            if batch.topic not in spec.reads:
                continue
            got = pickle.loads(batch.blob)
            add_stream_rows(streams, got)
            counter.add(len(got))
        counter.write()
        return streams, read, replayed


class FinalizeTask:
    """Tasks that no run wrote (``mapPartitionsWithIndex`` over one sub-topology's tasks): the
    stores their last run left (none: empty) -> ``write_task``."""

    def __init__(self, ctx, sub):
        self.ctx = ctx
        self.sub = sub

    def __call__(self, partition, items):
        from backfill.handoff import write_task
        from processor.errors import ProcessorError

        executor_logging(self.ctx.log_level, getattr(self.ctx, "log_json", False))
        passage = self.ctx.passage
        state = passage.task_inputs(self.sub, partition, [], (), items)[0]
        try:
            t0 = time.monotonic()
            stores, _ = decode_state(state)
            written = write_task(self.ctx, self.sub, partition, stores, t0)
        except ProcessorError as exc:
            return [ResultItem("stats", partition, {"error": error_info(exc)})]
        out = passage.keep(-1, str(TaskId(self.sub, partition)),
                           [ResultItem("db", partition, written["db"])] if "db" in written else [])
        out.append(ResultItem("stats", partition, {"entries": written["entries"], "seconds": written["seconds"],
                                                   "db": len(written.get("db", b"")),
                                                   "built": written.get("built", 0)}))
        return out
