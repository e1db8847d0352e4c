"""Outputs: the output rows of every run (dead letters always; sink records with
``--emit-outputs``) -> produced once, at the end, by the driver.

Invariant: each sink receives the history's result once: a table's sink (``to_stream().to()``)
the last record per key, a stream sink every record, in the order the tasks sent them (run,
origin task, send order); dead letters follow the topology's ``on_error`` policy as in the
worker. Output rows travel from the tasks as Arrow IPC bytes in Spark data, never as files.
"""

from __future__ import annotations

from processor.errors import ConfigError


def table_sinks(topo) -> set[str]:
    """Sink topics fed straight by a table's ``to_stream()``: they carry a table, so the history's
    result is the last record per key."""
    from processor.graph import ToStreamAttrs

    out = set()
    for n in topo.nodes:
        if n.sink_topic and not n.attrs.internal and n.parents and \
                all(isinstance(p.attrs, ToStreamAttrs) for p in n.parents):
            out.add(n.sink_topic)
    return out




def _decode(batches):
    """``mapInArrow``: batches of one ``ipc`` binary column -> the output rows they hold."""
    import pyarrow as pa

    for b in batches:
        for blob in b.column(0).to_pylist():
            with pa.ipc.open_stream(blob) as reader:
                yield from reader


def emit(spark, ctx, blobs, emit_outputs: bool) -> tuple[int, int]:
    """Produce the output rows of ``blobs`` (an RDD of Arrow IPC bytes, ``RowCollector.items``;
    None: no task had any):
    dead-letter records always (the on-error policy), sink records with ``emit_outputs`` (table
    sinks: last record per key). Returns (outputs, dead-lettered)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.window import Window

    from processor.kafka import clients as kafka

    from backfill.rows import output_schema

    if blobs is None:
        return 0, 0
    rows = (spark.createDataFrame(blobs.map(lambda b: (b,)), "ipc binary")
            .mapInArrow(_decode, from_arrow_schema(output_schema())).where(F.col("kind") == "output"))
    dlq = rows.where(F.col("topic") == ctx.dlq)
    selected = dlq
    if emit_outputs:
        sinks = rows.where(F.col("topic") != ctx.dlq)
        tables = sorted(table_sinks(ctx.topo))
        streams = sinks.where(~F.col("topic").isin(tables)) if tables else sinks
        last = Window.partitionBy("topic", "key").orderBy(F.col("run").desc(), F.col("seq").desc())
        table_rows = (sinks.where(F.col("topic").isin(tables)).withColumn("_n", F.row_number().over(last))
                      .where(F.col("_n") == 1).drop("_n")) if tables else None
        selected = selected.unionByName(streams)
        if table_rows is not None:
            selected = selected.unionByName(table_rows)
    producer = kafka.new_producer({**kafka.producer_defaults(ctx.bootstrap_servers), **ctx.producer_config},
                                  "backfill outputs")
    outputs = dead = 0
    errors = []
    for r in selected.orderBy("run", "origin", "seq").toLocalIterator():
        kw = {"timestamp": r.ts, "on_delivery": lambda err, msg: errors.append(err.str()) if err else None}
        if r.headers:
            kw["headers"] = [(h.key, h.value) for h in r.headers]
        if r.partition is not None:
            kw["partition"] = r.partition
        while True:
            try:
                producer.produce(r.topic, r.value, r.key, **kw)
                break
            except BufferError:
                producer.poll(0.05)
        if r.topic == ctx.dlq:
            dead += 1
        else:
            outputs += 1
    if producer.flush(120):
        raise ConfigError("backfill: output records not delivered within 120 s")
    if errors:
        raise ConfigError(f"backfill: {len(errors)} output record(s) failed, first: {errors[0]}")
    return outputs, dead


