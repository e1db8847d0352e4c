"""Topic history as a Spark DataFrame: a Python Data Source over Kafka offset ranges, plus archives.

``read_history(spark, bootstrap_servers, ranges, archives)`` returns the records of
``ranges = {topic: {partition: (start, end)}}`` (a snapshot, ``backfill.snapshot``) with the
schema of Spark's own ``kafka`` source (``SCHEMA``), optionally preceded by archived records.

Invariants:

- Kafka rows: exactly the records a consumer with the given config reads at offsets
  ``start <= offset < end`` of each partition, each once. An input partition (split) covers at
  most ``max_records_per_split`` offsets of one Kafka partition; splits of a partition are
  disjoint and together cover ``[start, end)``. A split stops at the first record at or beyond its
  end, or at partition EOF at or beyond its end (offsets taken by transaction markers or aborted
  records hold no record). EOF below the end, or ``start`` no longer in the log, fails the read
  (``auto.offset.reset=error``; a high watermark below ``start``, which Tansu answers with an
  empty fetch rather than OFFSET_OUT_OF_RANGE): history is never silently shorter than the snapshot.
- Archive rows (``archives = {topic: parquet path}``, same schema): the rows of that topic and of
  a partition in ``ranges`` whose offset is below the partition's ``start``, i.e. history older
  than what Kafka still holds. With ``start`` the earliest offset Kafka has, Kafka rows and archive
  rows never share an offset: no record twice, none missing (if the archive holds each record of
  that history once).
- Columns as Spark's kafka source: ``timestamp`` is the record's epoch milliseconds as a
  timestamp; ``timestampType`` is Java's id (-1 none, 0 create time, 1 log-append time;
  confluent-kafka numbers them one higher); ``headers`` is null for a record without headers,
  else its ``(key, value)`` pairs in order (duplicates kept, a null header value stays null).

Readers run in the executors and yield Arrow record batches of ``ARROW_SCHEMA``, which must equal
``to_arrow_schema(SCHEMA, timezone="UTC")`` exactly or Spark refuses them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from backfill.range_reader import BATCH_ROWS, iter_range
from processor.errors import ConfigError

FORMAT = "processor-kafka"
DEFAULT_MAX_RECORDS_PER_SPLIT = 200_000

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")

Ranges = dict  # {topic: {partition: (start, end)}}


@dataclass
class OffsetRange(InputPartition):
    """One input partition: offsets ``[start, end)`` of ``topic[partition]``."""

    topic: str
    partition: int
    start: int
    end: int


def split_ranges(ranges: Ranges, max_records: int) -> list[OffsetRange]:
    """The non-empty ``ranges`` cut into near-equal splits of at most ``max_records`` offsets,
    ordered by topic, partition, start."""
    if max_records < 1:
        raise ConfigError(f"max records per split must be at least 1, not {max_records}")
    out = []
    for topic in sorted(ranges):
        for partition in sorted(ranges[topic], key=int):
            start, end = (int(x) for x in ranges[topic][partition])
            n = end - start
            if n <= 0:
                continue
            pieces = -(-n // max_records)
            bounds = [start + n * i // pieces for i in range(pieces + 1)]
            out += [OffsetRange(topic, int(partition), a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


class KafkaHistorySource(DataSource):
    """``spark.read.format("processor-kafka")`` with options ``bootstrapServers``, ``ranges``
    (JSON ``{topic: {partition: [start, end]}}``), ``maxRecordsPerSplit`` (default 200000) and
    ``consumerConfig`` (JSON of extra librdkafka settings: security, ``isolation.level``)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self):
        return SCHEMA

    def reader(self, schema: StructType) -> KafkaHistoryReader:
        return KafkaHistoryReader(self.options)


class KafkaHistoryReader(DataSourceReader):
    def __init__(self, options):
        try:
            self.bootstrap_servers = options["bootstrapServers"]
            self.ranges = json.loads(options["ranges"])
        except KeyError as exc:
            raise ConfigError(f"{FORMAT}: option {exc.args[0]!r} is required") from None
        self.max_records = int(options.get("maxRecordsPerSplit", DEFAULT_MAX_RECORDS_PER_SPLIT))
        self.consumer_config = json.loads(options.get("consumerConfig", "{}"))

    def partitions(self) -> list[OffsetRange]:
        return split_ranges(self.ranges, self.max_records)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):   # Spark's stand-in when there is no split
            return iter(())
        return read_range(self.bootstrap_servers, partition, self.consumer_config)


def read_range(bootstrap_servers: str, split: OffsetRange, consumer_config: dict | None = None,
               batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The records of ``split`` as Arrow batches of ``ARROW_SCHEMA`` (see the module invariants)."""
    cols = _Columns()
    for msgs in iter_range(bootstrap_servers, split, consumer_config, batch_rows):
        for m in msgs:
            cols.add(m)
        if len(cols) >= batch_rows:
            yield cols.batch(split.topic, split.partition)
    if len(cols):
        yield cols.batch(split.topic, split.partition)


class _Columns:
    """Column buffers of the rows read so far."""

    def __init__(self):
        self.clear()

    def clear(self):
        self.keys, self.values, self.offsets, self.ts, self.ts_types, self.headers = [], [], [], [], [], []

    def __len__(self):
        return len(self.offsets)

    def add(self, m) -> None:
        self.keys.append(m.key())
        self.values.append(m.value())
        self.offsets.append(m.offset())
        ts_type, ts = m.timestamp()
        self.ts.append(ts)
        self.ts_types.append(ts_type - 1)   # confluent-kafka 0/1/2 -> Java -1/0/1
        self.headers.append(m.headers() or None)

    def batch(self, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self)
        millis = pa.array(self.ts, pa.int64())
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(ARROW_SCHEMA.field("timestamp").type),
            pa.array(self.ts_types, pa.int32()),
            pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
        ]
        self.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("processor-kafka")`` available in ``spark``."""
    spark.dataSource.register(KafkaHistorySource)


def read_history(spark: SparkSession, bootstrap_servers: str, ranges: Ranges,
                 archives: dict[str, str] | None = None,
                 max_records_per_split: int = DEFAULT_MAX_RECORDS_PER_SPLIT,
                 consumer_config: dict | None = None) -> DataFrame:
    """The history of ``ranges`` (``{topic: {partition: (start, end)}}``, e.g.
    ``backfill.snapshot.to_ranges(snapshot_offsets(...))``) as a DataFrame of ``SCHEMA``: the
    Kafka rows, and for each topic in ``archives`` (``{topic: parquet path}``) its archived rows
    below each partition's ``start``. Row order is not defined; sort by (topic, partition, offset).
    ``consumer_config`` must be the one the snapshot was taken with."""
    for topic in archives or {}:
        if topic not in ranges:
            raise ConfigError(f"archive given for topic {topic!r}, which is not read (topics: {sorted(ranges)})")
    register(spark)
    plain = {t: {str(p): [int(s), int(e)] for p, (s, e) in parts.items()} for t, parts in ranges.items()}
    df = (spark.read.format(FORMAT)
          .option("bootstrapServers", bootstrap_servers)
          .option("ranges", json.dumps(plain))
          .option("maxRecordsPerSplit", str(max_records_per_split))
          .option("consumerConfig", json.dumps(consumer_config or {}))
          .load())
    for topic, path in (archives or {}).items():
        df = df.unionByName(archive_rows(spark, topic, path, ranges[topic]))
    return df


def archive_rows(spark: SparkSession, topic: str, path: str, starts: dict) -> DataFrame:
    """The rows of the Parquet archive at ``path`` of ``topic`` whose offset is below the ``start``
    of their partition in ``starts`` (``{partition: (start, end)}``); other partitions' rows are
    dropped. ``ConfigError`` if ``path`` does not exist or its columns are not ``SCHEMA``'s."""
    from pyspark.errors import AnalysisException

    try:
        archive = spark.read.parquet(path)
    except AnalysisException as exc:
        if exc.getCondition() == "PATH_NOT_FOUND":
            raise ConfigError(f"archive of topic {topic!r}: path {path} does not exist") from None
        raise ConfigError(f"archive of topic {topic!r} at {path}: {exc.getMessage()}") from None
    found = {f.name: f.dataType.simpleString() for f in archive.schema.fields}
    wrong = [f"{f.name} {f.dataType.simpleString()}" for f in SCHEMA.fields
             if found.get(f.name) != f.dataType.simpleString()]
    if wrong:
        raise ConfigError(f"archive of topic {topic!r} at {path} lacks column(s) {', '.join(wrong)} "
                          f"(the schema of Spark's kafka source)")
    below_start = reduce(lambda a, b: a | b,
                         [(F.col("partition") == int(p)) & (F.col("offset") < int(s)) for p, (s, _) in starts.items()],
                         F.lit(False))
    return archive.select(*SCHEMA.fieldNames()).where((F.col("topic") == topic) & below_start)
