"""The backlog of ``tests/integration/test_time_ordered_backlog.py`` (issue 34) through the backfill
(real local Spark, real broker, ``emit_outputs=True``): a stream-table join and a stream-stream
join over topics produced one after the other, on 2 partitions, by the records' timestamps and by
a timestamp extractor reading the payload (the broker timestamps then run backwards). The
outputs equal the model's and, per key in order, the test driver's fed each partition in event
time order, which the broker test shows the worker's equal too; the table's store equals the
driver's byte for byte, row timestamps (event times) included."""

import pytest

import backfill
from processor.kafka import clients as kafka
from tests.integration.helpers import by_key, task_store_bytes
from tests.integration.test_time_ordered_backlog import (
    driver_by_partition,
    enriched_of,
    history,
    model_enriched,
    model_pairs,
    pairs_of,
    produce_history,
    topology_for,
)

PARTS = 2


@pytest.mark.parametrize("extract", [False, True], ids=["record-time", "payload-time"])
def test_backfill_of_a_backlog_joins_in_time_order(kafka_bootstrap, spark, tmp_path, unique, extract, report):
    t = {n: f"btob-{n}-{int(extract)}-{unique}" for n in ("users", "clicks", "enriched", "left", "right", "pairs")}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    h = history()
    produce_history(kafka_bootstrap, t, h, extract)
    app = f"btob-{int(extract)}-{unique}"
    topo = topology_for(t, extract)
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path,
                       spark=spark, emit_outputs=True)
    got = {o: by_key(kafka.read_topic(kafka_bootstrap, t[o])) for o in ("enriched", "pairs")}
    assert enriched_of(got["enriched"]) == model_enriched(h)
    assert pairs_of(got["pairs"]) == model_pairs(h)
    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks", "left", "right")}
    want, stored = driver_by_partition(t, inputs, PARTS, app, extract)
    assert got == want
    sub = topo.subtopology_of_topic()[t["users"]]
    for part in range(PARTS):
        assert task_store_bytes([tmp_path / app / f"task-{sub}_{part}"], ["users"]) == stored[part], part
    if extract:   # the extractor's table is replayed whole, the reason named
        assert "timestamp extractor" in rep.compaction.get(t["users"], ""), rep.compaction
    report(f"backlog backfill ({'payload' if extract else 'record'} time): {rep.rows_read} rows, "
           f"{sum(map(len, got['enriched'].values()))} enriched, {len(pairs_of(got['pairs']))} pairs")


def test_backfill_with_a_failing_extractor_dead_letters_exactly_the_drivers(kafka_bootstrap, spark, tmp_path,
                                                                             unique, report):
    """``tests/integration/test_timestamp_extractor_e2e.py``'s history through the backfill: the
    join's results equal the model's and the driver's, the stores the driver's byte for byte,
    and the dead-letter topic holds exactly the records whose extraction failed, as they were."""
    from tests.integration import test_timestamp_extractor_e2e as tx

    t = {n: f"btx-{n}-{unique}" for n in ("users", "clicks", "out")}
    kafka.create_topics(kafka_bootstrap, {v: tx.PARTS for v in t.values()})
    h = tx.history()
    tx.produce_history(kafka_bootstrap, t, h)
    app = f"btx-{unique}"
    topo = tx.topology_for(t)
    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app, state_dir=tmp_path,
                       spark=spark, emit_outputs=True)
    got = by_key(kafka.read_topic(kafka_bootstrap, t["out"]))
    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks")}
    want, stores, want_dlq = tx.driver_run(t, inputs, app)
    assert got == want
    bad = tx.check_dead_letters(kafka.read_topic(kafka_bootstrap, f"{app}-dlq"), h)
    assert bad == want_dlq and len(bad) == 7
    sub = topo.subtopology_of_topic()[t["users"]]
    for part in range(tx.PARTS):
        assert task_store_bytes([tmp_path / app / f"task-{sub}_{part}"], tx.STORES) == stores[part], part
    report(f"failing extractor through the backfill: {rep.rows_read} rows, {len(bad)} dead-lettered")
