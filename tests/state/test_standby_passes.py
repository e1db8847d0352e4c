"""Standby passes (``processor/runtime/standby.py``, issue 36) over real changelogs (the test
broker) and real RocksDB databases.

1. A pass cut short anywhere leaves each store of the standby's database equal to its changelog's
   records below the checkpoint it wrote (intermediate commits every few hundred records here),
   the next pass goes on from there, and a completed pass holds the active worker's stores byte
   for byte. The same directory then serves as an active task (promotion: nothing to restore) and
   as a standby again (demotion, while the former active catches up on what the promoted one
   wrote): the standby ends equal to the active and to the totals of every order produced.
2. Every pass reads through one consumer; a standby directory that cannot be opened, or whose
   local state does not match its changelogs, is set aside with one log line and tried again,
   while the other standbys go on.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from processor.kafka import clients as kafka
from processor.runtime import changelog_reader
from processor.runtime.standby import StandbyTasks
from processor.runtime.worker import Worker
from processor.state.rocksdb import RocksDBDatabase
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import produce, task_store_bytes

PARTS = 2
CUSTOMERS = 1_500


def totals_topology(src: str, out: str):
    return apps.customer_totals_topology(src, out)


def orders(lo: int, hi: int) -> list[tuple[bytes, bytes]]:
    return apps.customer_orders(lo, hi, CUSTOMERS)


def expected_totals(hi: int) -> dict[str, dict]:
    want: dict[str, dict] = {}
    for _, v in orders(0, hi):
        o = json.loads(v)
        a = want.setdefault(o["customer"], {"n": 0, "sum": 0})
        a["n"] += 1
        a["sum"] += o["amount"]
    return want


def drain(topology, bootstrap: str, app: str, state_dir, guarantee: str) -> Worker:
    w = Worker(topology, bootstrap, app, state_dir, commit_interval_ms=200, processing_guarantee=guarantee,
               consumer_config={**TEST_CONSUMER_CONFIG, "isolation.level": "read_uncommitted"})
    t = threading.Thread(target=w.run, kwargs={"until_drained": True, "install_signal_handlers": False})
    t.start()
    t.join(180)
    assert not t.is_alive(), "the worker did not drain in 180 s"
    return w


def stateful_tasks(topology) -> list[tuple[int, int]]:
    return [(sub, p) for sub in range(len(topology.subtopologies)) if topology.changelogs_of(sub)
            for p in range(PARTS)]


def stores_of(app_dir, topology) -> dict[str, dict]:
    names = sorted({n for sub in range(len(topology.subtopologies)) for n in topology.changelogs_of(sub)})
    dirs = sorted(app_dir.glob("task-*"))
    assert dirs, app_dir
    return task_store_bytes(dirs, names, by_task=True)


def read_changelogs(bootstrap: str, topology, tasks) -> dict[tuple[str, int], list]:
    """Every record of the tasks' changelog partitions: ``{(topic, partition): [(offset, key, value)]}``."""
    out: dict[tuple[str, int], list] = {}
    for topic in sorted({t for sub, _ in tasks for t in topology.changelogs_of(sub).values()}):
        for m in kafka.read_topic(bootstrap, topic, isolation_level="read_uncommitted"):
            out.setdefault((topic, m.partition()), []).append((m.offset(), m.key(), m.value()))
    return out


def table_below(records: list, end: int) -> list[tuple[bytes, bytes]]:
    """The table of changelog ``records`` below offset ``end`` (last write wins, tombstones delete)."""
    table: dict[bytes, bytes] = {}
    for off, k, v in records:
        if off >= end:
            break
        if v is None:
            table.pop(k, None)
        else:
            table[k] = v
    return sorted(table.items())


def check_against_changelogs(app_dir, topology, tasks, logs) -> int:
    """Each store of each task database equals its changelog below the checkpoint the database
    names for it; returns the sum of those checkpoints (how far the databases reach)."""
    reach = 0
    for sub, p in tasks:
        db = RocksDBDatabase(app_dir / f"task-{sub}_{p}")
        try:
            checkpoint = db.read_checkpoint()
            for name, topic in topology.changelogs_of(sub).items():
                end = checkpoint.get((topic, p), 0)
                reach += end
                assert sorted(db.store(name).items()) == table_below(logs.get((topic, p), []), end), \
                    (sub, p, name, end)
        finally:
            db.close()
    return reach


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_passes_cut_short_anywhere_stay_consistent_and_the_directory_serves_both_roles(
        kafka_bootstrap, unique, tmp_path, monkeypatch, report, guarantee):
    src, out, app = f"orders-{unique}", f"totals-{unique}", f"passes-{unique}"
    kafka.create_topics(kafka_bootstrap, {src: PARTS, out: PARTS})
    topology = totals_topology(src, out)
    app_topology = topology.for_application(app)
    tasks = stateful_tasks(topology)
    produce(kafka_bootstrap, src, orders(0, 24_000))
    active_dir, standby_dir = tmp_path / "active", tmp_path / "standby"
    w = drain(totals_topology(src, out), kafka_bootstrap, app, active_dir, guarantee)
    logs = read_changelogs(kafka_bootstrap, app_topology, tasks)
    full = sum(len(v) for v in logs.values())

    # 1. passes cut short after 1, 2, 3, ... steps (the standby set changes: every database closes)
    monkeypatch.setattr(changelog_reader, "RESTORE_COMMIT_EVERY", 400)
    standby = StandbyTasks(app_topology, standby_dir / app, w.task_manager.restore_consumer_config(),
                           threading.Event(), interval_s=0.0)
    reaches: list[int] = []
    steps = 0
    try:
        while True:
            steps += 1
            standby.update(tasks)
            done = False
            for _ in range(steps):
                if standby.step(budget_s=0.001):
                    done = True
                    break
            standby.update([])
            reaches.append(check_against_changelogs(standby_dir / app, app_topology, tasks, logs))
            if done:
                break
            assert steps < 200, reaches
    finally:
        standby.close()
    assert reaches == sorted(reaches), reaches   # never backwards
    partway = [r for r in reaches if 0 < r < reaches[-1]]
    assert len(partway) >= 2, reaches             # some passes were cut short partway
    assert stores_of(standby_dir / app, app_topology) == stores_of(active_dir / app, app_topology)

    # 2. promotion: a worker over the standby's directory restores nothing, and goes on from it
    produce(kafka_bootstrap, src, orders(24_000, 26_000))
    promoted = drain(totals_topology(src, out), kafka_bootstrap, app, standby_dir, guarantee)
    assert promoted.restored_records == 0

    # 3. demotion: the same directory a standby again, while the former active takes the tasks
    # back (it reads what the promoted worker wrote) and goes on
    produce(kafka_bootstrap, src, orders(26_000, 28_000))
    back = drain(totals_topology(src, out), kafka_bootstrap, app, active_dir, guarantee)
    assert back.restored_records > 0
    standby = StandbyTasks(app_topology, standby_dir / app, w.task_manager.restore_consumer_config(),
                           threading.Event(), interval_s=0.0)
    try:
        standby.update(tasks)
        standby.catch_up()
        assert all(standby.caught_up_once(k) for k in tasks)
    finally:
        standby.close()
    logs = read_changelogs(kafka_bootstrap, app_topology, tasks)
    check_against_changelogs(standby_dir / app, app_topology, tasks, logs)
    assert stores_of(standby_dir / app, app_topology) == stores_of(active_dir / app, app_topology)
    got = {k.decode(): json.loads(v[8:]) for (_, k), v in stores_of(standby_dir / app, app_topology)["totals"].items()}
    assert got == expected_totals(28_000)
    report(f"{guarantee}: standby passes cut short after 1..{steps - 1} steps (intermediate commits every "
           f"400 records; {len(partway)} left partway) over changelogs of {full} records: each database "
           f"equal to its changelogs below its checkpoint; promoted and demoted over the same directory")


def test_one_consumer_for_every_pass_and_a_bad_standby_is_set_aside(kafka_bootstrap, unique, tmp_path, caplog):
    src, out, app = f"orders-{unique}", f"totals-{unique}", f"aside-{unique}"
    kafka.create_topics(kafka_bootstrap, {src: PARTS, out: PARTS})
    topology = totals_topology(src, out)
    app_topology = topology.for_application(app)
    tasks = stateful_tasks(topology)
    others = [k for k in tasks if k[0] == 1]   # the aggregate's tasks (the repartitioning ones keep bookkeeping)
    good, bad = others
    produce(kafka_bootstrap, src, orders(0, 4_000))
    active_dir, standby_dir = tmp_path / "active", tmp_path / "standby"
    w = drain(totals_topology(src, out), kafka_bootstrap, app, active_dir, "at_least_once")
    caplog.set_level(logging.INFO, logger="processor.standby")

    def lines(key) -> list[str]:
        return [r.getMessage() for r in caplog.records
                if f"standby replica of task {key[0]}_{key[1]} set aside" in r.getMessage()]

    (standby_dir / app).mkdir(parents=True)
    not_a_db = standby_dir / app / f"task-{bad[0]}_{bad[1]}"
    not_a_db.write_text("not a database")
    standby = StandbyTasks(app_topology, standby_dir / app, w.task_manager.restore_consumer_config(),
                           threading.Event(), interval_s=0.0, retry_s=0.05)
    try:
        standby.update(tasks)   # (opening the bad one fails: set aside, the others open)
        assert sorted(standby.set_aside) == [bad]
        assert sorted(standby.dbs) == sorted(set(tasks) - {bad})
        for _ in range(4):   # passes over the good one; the bad one tried again, failing the same way
            standby.catch_up()
            threading.Event().wait(0.06)
        assert standby.passes == 4
        assert [standby.caught_up_once(k) for k in tasks] == [k != bad for k in tasks]
        assert len(lines(bad)) == 1, lines(bad)
        assert "FileExistsError" in lines(bad)[0], lines(bad)
        assert standby.consumers_opened == 1

        not_a_db.unlink()   # repaired: the next retry opens it, the next pass catches it up
        threading.Event().wait(0.06)
        standby.catch_up()
        assert sorted(standby.dbs) == sorted(tasks) and not standby.set_aside
        assert f"standby replica of task {bad[0]}_{bad[1]} caught up: it is kept again" in caplog.messages
        assert all(standby.caught_up_once(k) for k in tasks)

        # local state past its changelog's end (as after the topics were recreated): that standby
        # alone is set aside, the other's passes go on
        topic = app_topology.changelogs_of(good[0])["totals"]
        standby.dbs[good].commit({(topic, good[1]): 10**9})
        for _ in range(3):
            standby.catch_up()
            threading.Event().wait(0.06)
        assert sorted(standby.set_aside) == [good] and sorted(standby.dbs) == sorted(set(tasks) - {good})
        assert [standby.caught_up_once(k) for k in tasks] == [k != good for k in tasks]
        assert len(lines(good)) == 1 and "ChangelogMismatch" in lines(good)[0], lines(good)
        assert standby.consumers_opened == 1
        assert standby.passes == 4 + 1 + 3
    finally:
        standby.close()
    a = stores_of(active_dir / app, app_topology)["totals"]
    s = stores_of(standby_dir / app, app_topology)["totals"]
    name = f"task-{bad[0]}_{bad[1]}"
    assert sorted((k, v) for k, v in s.items() if k[0] == name) == sorted((k, v) for k, v in a.items() if k[0] == name)
