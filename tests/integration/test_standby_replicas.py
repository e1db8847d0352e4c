"""Standby replicas (processor/runtime/standby.py, issue 36): a standby kept by reading a task's
changelogs holds, byte for byte, the stores of the worker that runs the task; a worker promoted
over the standby's state directory restores nothing from scratch, where a fresh one reads every
changelog record."""

from __future__ import annotations

import json
import threading

from processor.kafka import clients as kafka
from processor.runtime.standby import StandbyTasks
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import final_table, produce
from tests.integration.helpers import task_store_bytes as _task_store_bytes

PARTS = 4


def totals_topology(src: str, out: str):
    return apps.customer_totals_topology(src, out)


def orders(lo: int, hi: int) -> list[tuple[bytes, bytes]]:
    return apps.customer_orders(lo, hi, 97)


def stores_of(state_dir, topology) -> dict[str, dict]:
    """Every store of every stateful task of ``topology`` under ``state_dir``, by task."""
    names = sorted({n for sub in range(len(topology.subtopologies)) for n in topology.changelogs_of(sub)})
    dirs = sorted(state_dir.glob("task-*"))
    assert dirs, state_dir
    return _task_store_bytes(dirs, names, by_task=True)


def drain(topology, bootstrap, app, state_dir) -> Worker:
    w = Worker(topology, bootstrap, app, state_dir, commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
    t = threading.Thread(target=w.run, kwargs={"until_drained": True, "install_signal_handlers": False})
    t.start()
    t.join(180)
    assert not t.is_alive(), "the worker did not drain in 180 s"
    return w


def test_a_standby_holds_the_active_stores_and_its_promotion_restores_only_the_tail(kafka_bootstrap, unique,
                                                                                    tmp_path, report):
    src, out, app = f"orders-{unique}", f"totals-{unique}", f"standby-{unique}"
    kafka.create_topics(kafka_bootstrap, {src: PARTS, out: PARTS})
    topology = totals_topology(src, out)
    stateful = [(sub, p) for sub in range(len(topology.subtopologies)) if topology.changelogs_of(sub)
                for p in range(PARTS)]
    produce(kafka_bootstrap, src, orders(0, 20_000))
    active_dir, standby_dir = tmp_path / "active", tmp_path / "standby"
    w = drain(totals_topology(src, out), kafka_bootstrap, app, active_dir)
    assert w.records_processed == 40_000    # the orders, then the repartitioned orders

    app_topology = topology.for_application(app)
    # (a worker's tasks are under <state dir>/<application id>)
    standby = StandbyTasks(app_topology, standby_dir / app, w.task_manager.restore_consumer_config(),
                           threading.Event())
    try:
        standby.catch_up(timeout_s=1.0)   # none yet: nothing to wait for
        assert standby.passes == 0
        standby.update(stateful)
        standby.catch_up()
        first = dict(standby.records_read)
        standby.close()     # (the comparison opens the databases)
        assert stores_of(standby_dir / app, app_topology) == stores_of(active_dir / app, app_topology)
        standby.update(stateful)
        # more history, processed by the active worker (reopened from its local state): the
        # standby's next pass reads only what was written since
        produce(kafka_bootstrap, src, orders(20_000, 22_000))
        drain(totals_topology(src, out), kafka_bootstrap, app, active_dir)
        standby.catch_up()
        more = {k: standby.records_read[k] - first[k] for k in first}
        sums = standby.offset_sums()
        assert standby.passes == 2
    finally:
        standby.close()
    assert stores_of(standby_dir / app, app_topology) == stores_of(active_dir / app, app_topology)
    # (the changelogs hold one record per changed key per commit: 97 customers)
    assert 0 < sum(more.values()) < sum(first.values()), (first, more)
    assert sorted(sums) == sorted(stateful) and all(v > 0 for v in sums.values())
    report(f"standby: first pass read {sum(first.values())} changelog records, the next "
           f"{sum(more.values())} (after 2,000 more orders)")

    # failover: the active worker is gone; a worker over the standby's directory takes the tasks
    produce(kafka_bootstrap, src, orders(22_000, 23_000))
    promoted = drain(totals_topology(src, out), kafka_bootstrap, app, standby_dir)
    fresh_dir = tmp_path / "fresh"
    produce(kafka_bootstrap, src, orders(23_000, 23_500))
    fresh = drain(totals_topology(src, out), kafka_bootstrap, app, fresh_dir)
    report(f"changelog records restored: over the standby {promoted.restored_records}, "
           f"over an empty directory {fresh.restored_records}")
    assert promoted.restored_records == 0
    assert fresh.restored_records >= sum(first.values())
    # and the state went on from the standby's: each customer's last output counts every order
    want: dict[str, dict] = {}
    for _, v in orders(0, 23_500):
        o = json.loads(v)
        a = want.setdefault(o["customer"], {"n": 0, "sum": 0})
        a["n"] += 1
        a["sum"] += o["amount"]
    got = {k.decode(): json.loads(v) for k, v in final_table(kafka.read_topic(kafka_bootstrap, out)).items()}
    assert got == want
