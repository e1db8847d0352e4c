"""``backfill.run(..., archives={topic: path})``: history older than what Kafka holds comes from
a Parquet archive with the schema of Spark's kafka source, and the stores equal the test
driver's over the whole history.

Tansu has no retention and no DeleteRecords, so "Kafka no longer holds offsets below S" is
simulated: the snapshot is wrapped to report each partition's earliest offset as S (the records
below S are still in the broker, which is what makes the test able to fail). Kafka's records
below S are decoys (other values), the archive holds the true ones, so a backfill that read
Kafka below the snapshot's start, or skipped the archive, or read an archive row at or above S,
ends with other stores. Both paths of a task's input are covered: a table reduced to its last
real changes (filter_map) and one replayed record by record (table_aggregates)."""

from __future__ import annotations

import datetime as dt
import random

import pytest

import backfill
import backfill.snapshot
from backfill.kafka_source import SCHEMA
from processor.engine.partitioners import INTERNAL
from processor.kafka import clients as kafka
from tests.integration.helpers import produce

from .test_backfill_differential import T0, _backfilled, _driver, _js, filter_map, table_aggregates, table_history

PARTS = 2
START = 90   # the earliest offset "Kafka still holds" in each partition


def _decoy(value: bytes | None) -> bytes:
    return _js({"a": 77, "g": "decoy"}) if value is None else value.replace(b'"g":"g', b'"g":"d')


@pytest.mark.integration
@pytest.mark.parametrize("make", [filter_map, table_aggregates], ids=["compacted", "every_record"])
def test_archive_supplies_the_history_below_kafkas_earliest_offset(make, kafka_bootstrap, spark, tmp_path, unique,
                                                                    monkeypatch, report):
    case = make.__name__
    rnd = random.Random(f"archive-{case}")
    topics = {n: f"arch-{case}-{n}-{unique}" for n in ("a", "out", "out2")}
    # keys written only at the start (so only the archive holds their values), then the rest
    early = [(f"e{j:02d}".encode(), _js({"a": rnd.randrange(100), "g": "g1"})) for j in range(20)]
    history = early + table_history(rnd, 500, 50)
    placed, offsets = [], {p: 0 for p in range(PARTS)}
    for k, _v in history:
        p = INTERNAL.partition(k, PARTS)
        placed.append((p, offsets[p]))
        offsets[p] += 1
    assert all(n > START + 50 for n in offsets.values())
    archived = [i for i, (_, off) in enumerate(placed) if off < START]

    kafka.create_topics(kafka_bootstrap, {t: PARTS for t in topics.values()})
    in_kafka = [(k, _decoy(v)) if i in set(archived) else (k, v) for i, (k, v) in enumerate(history)]
    produce(kafka_bootstrap, topics["a"], in_kafka, timestamps=[T0 + i for i in range(len(history))])
    back = kafka.read_topic(kafka_bootstrap, topics["a"])
    assert sorted((m.partition(), m.offset(), m.key()) for m in back) == \
        sorted((p, off, history[i][0]) for i, (p, off) in enumerate(placed))

    # the archive: the true records below START (as a topic archive in a data lake holds them),
    # plus records at and above START with decoy values, which must not be read
    rows = []
    for i, (p, off) in enumerate(placed):
        if off < START + 10:
            k, v = history[i]
            rows.append((k, v if off < START else _decoy(v), topics["a"], p, off,
                         dt.datetime.fromtimestamp((T0 + i) / 1000, dt.UTC), 0, None))
    archive = str(tmp_path / "archive")
    spark.createDataFrame(rows, SCHEMA).write.parquet(archive)

    real = backfill.snapshot.snapshot_offsets

    def retained(bootstrap, topics_, **kw):
        return {tp: ((max(s, START), e) if tp[0] == topics["a"] else (s, e))
                for tp, (s, e) in real(bootstrap, topics_, **kw).items()}

    monkeypatch.setattr(backfill.snapshot, "snapshot_offsets", retained)
    app = f"arch-{case}-{unique}"
    topo = make(topics)
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path / "state",
                       spark=spark, archives={topics["a"]: archive})

    assert rep.snapshot == {(topics["a"], p): (START, offsets[p]) for p in range(PARTS)}
    assert rep.rows_read == len(history)   # START archived rows + the rest from Kafka, per partition
    names = list(topo.stores) + ["_bookkeeping"]
    got = _backfilled(tmp_path / "state", app, names)
    want = _driver(topo, topics, [("a", k, v) for k, v in history], app)
    decoyed = _driver(topo, topics, [("a", k, v) for k, v in in_kafka], app)
    for name in topo.stores:
        assert got[name] == want[name], f"{case}: store {name}"
    assert any(decoyed[n] != want[n] for n in topo.stores), "the decoys change nothing: the test could not fail"
    report(f"archive ({case}): {len(archived)} of {len(history)} records from the archive (offsets below {START} "
           f"in each of {PARTS} partitions), the rest from Kafka; rows read {rep.rows_read}, replayed "
           f"{rep.rows_replayed}; stores {', '.join(sorted(topo.stores))} equal the driver's over the whole history")
