"""Backfill of a topology whose tables' source topics are their changelogs
(``build(reuse_source_topics=True)``): the backfill writes no changelog for those stores, but
the offsets it rejected go to the task changelog, so a worker that lost the backfilled state
directory restores the tables from their source topics up to the snapshot and ends with the
driver's stores, byte for byte, after more history."""

import json
import shutil

import pytest

import backfill
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.backfill.test_backfill_handoff import (
    PARTS,
    _driver_stores,
    _produce_all,
    _state_stores,
    history,
    make_topology,
)
from tests.conftest import TEST_CONSUMER_CONFIG


def _with_rejected(recs):
    """Order ``same`` (outside the history's keys): A, a value that is not JSON (dead-lettered), A
    again: its row keeps the first A's timestamp, which a restore applying the rejected record would lose. More poison
    between the others."""
    a = json.dumps({"amount": 77}).encode()
    recs = list(recs)
    recs[50:50] = [("orders", b"same", a), ("orders", b"same", b"{not json"), ("orders", b"same", a)]
    recs[900:900] = [("orders", b"o7", b"\xff\xfe"), ("shipments", b"o8", b"[oops")]
    return recs


@pytest.mark.integration
def test_backfilled_tables_restore_from_their_source_topics(kafka_bootstrap, spark, tmp_path, unique, report):
    topics = {"orders": f"bfr-orders-{unique}", "shipments": f"bfr-ship-{unique}", "clicks": f"bfr-clicks-{unique}"}
    topo = make_topology(topics["orders"], topics["clicks"], topics["shipments"], reuse_source_topics=True)
    outs = topo.sink_topics(internal=False)
    kafka.create_topics(kafka_bootstrap, {**{t: PARTS for t in topics.values()}, **{t: PARTS for t in outs}})
    app = f"bfr-app-{unique}"
    t0 = 1_000_000
    first = _with_rejected(history(2000, seed=21))
    _produce_all(kafka_bootstrap, topics, first, t0)

    rep = backfill.run(topo, bootstrap_servers=kafka_bootstrap, application_id=app,
                       state_dir=tmp_path / "state", spark=spark)
    assert rep.rows_read == len(first)
    expected = _driver_stores(topo, topics, first, t0)
    got = _state_stores(tmp_path / "state", app, list(topo.stores))
    for name in topo.stores:
        assert list(got[name].items()) == list(expected[name].items()), name
    changelogs = sorted(t for t in kafka.topic_partitions(kafka_bootstrap)
                        if t.startswith(f"{app}-") and t.endswith("-changelog"))
    assert f"{app}-orders-changelog" not in changelogs and f"{app}-shipments-changelog" not in changelogs
    assert f"{app}-clicks-per-user-changelog" in changelogs
    dead = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
    assert sorted(m.value() for m in dead) == sorted([b"[oops", b"\xff\xfe", b"{not json"])

    # the state directory is lost: the worker restores from the changelogs and source topics
    shutil.rmtree(tmp_path / "state")
    second = history(1000, seed=22)
    _produce_all(kafka_bootstrap, topics, second, t0 + len(first))
    w = Worker(topo, kafka_bootstrap, app, tmp_path / "state", consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert w.records_processed == len(second)
    orders_and_shipments = sum(1 for kind, _, _ in first if kind != "clicks")
    assert w.restored_records >= orders_and_shipments
    everything = first + second
    expected = _driver_stores(topo, topics, everything, t0)
    got = _state_stores(tmp_path / "state", app, list(topo.stores))
    for name in topo.stores:
        assert list(got[name].items()) == list(expected[name].items()), name
    assert got["orders"][b"same"] == (t0 + 50).to_bytes(8, "big") + json.dumps({"amount": 77}).encode()
    report(f"backfill with reused source topics: {w.restored_records} records restored, "
           f"{w.records_processed} processed after the snapshot")
