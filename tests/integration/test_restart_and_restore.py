"""Restarting a worker: with its state directory it resumes from its checkpoint; with the state
directory gone it rebuilds every store from its changelog topic (every record of the app's
changelogs, nothing from the source topic). Either way the output equals the test driver's
exactly (a clean stop commits everything, so nothing is replayed)."""

import shutil
import signal
import threading

import pytest

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    by_key,
    committed_offsets,
    driver_output_by_key,
    produce,
    table_updates,
    wait_for,
)


@pytest.mark.parametrize("lose_state", [False, True], ids=["same-state-dir", "state-dir-lost"])
def test_restart_resumes_with_exact_output(kafka_bootstrap, unique, tmp_path, monkeypatch, lose_state):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: 2, out: 2})
    records = table_updates(4_000, keys=300, seed=11)

    def run_once():
        w = Worker(apps.filter_topology(), kafka_bootstrap, app, tmp_path / "state",
                   consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        return w

    produce(kafka_bootstrap, inp, records[:2_000])
    first = run_once()
    assert first.records_processed == 2_000
    changelog_records = 0
    if lose_state:
        shutil.rmtree(tmp_path / "state")
        changelogs = [t for t in kafka.topic_partitions(kafka_bootstrap)
                      if t.startswith(f"{app}-") and t.endswith("-changelog")]
        assert sorted(changelogs) == sorted(
            [f"{app}-__task-0-changelog", f"{app}-_bookkeeping-0-changelog",
             f"{app}-{inp}-STATE-STORE-0000000000-changelog"])
        changelog_records = sum(len(kafka.read_topic(kafka_bootstrap, t)) for t in changelogs)
    produce(kafka_bootstrap, inp, records[2_000:], timestamp0=5_000_000)
    second = run_once()
    assert second.records_processed == 2_000
    assert second.restored_records == changelog_records
    if lose_state:   # one record per key (300 keys, deduplicated per commit) + commit records
        assert 300 <= changelog_records < 2_000

    got = by_key(kafka.read_topic(kafka_bootstrap, out))
    want = driver_output_by_key(apps.filter_topology, inp, out, kafka.read_topic(kafka_bootstrap, inp))
    assert got == want


def test_group_offset_never_moves_backwards_when_local_checkpoint_is_stale(kafka_bootstrap, unique, tmp_path):
    """Worker with state dir A processes 0..50; another (state dir B) goes on to 100; A's stale
    local checkpoint (50) must not pull the group's committed offset back on A's restart."""
    from processor import StreamsBuilder

    inp, out, app = f"events-{unique}", f"copy-{unique}", f"app-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})

    def topo():
        b = StreamsBuilder()
        b.stream(inp).to(out)
        return b.build()

    def run(state):
        w = Worker(topo(), kafka_bootstrap, app, tmp_path / state, consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        return w

    def group_offset():
        return committed_offsets(kafka_bootstrap, app, inp, 1)[0]

    produce(kafka_bootstrap, inp, [(b"k", b"1")] * 50)
    assert run("A").records_processed == 50
    produce(kafka_bootstrap, inp, [(b"k", b"2")] * 50)
    assert run("B").records_processed == 50
    assert group_offset() == 100
    again = run("A")
    assert again.records_processed == 0
    assert group_offset() == 100
    assert len(kafka.read_topic(kafka_bootstrap, out)) == 100


def test_a_group_offset_behind_the_restored_position_is_committed_without_new_input(kafka_bootstrap, unique,
                                                                                   tmp_path, monkeypatch):
    """A previous owner whose last group commit never landed (its changelogs hold the position):
    the group's offsets set back to 10 of 2,000 after a clean run, a worker on a new state
    directory restores every task from the changelogs at the end of the input, processes
    nothing, and commits the group's offsets up to the ends all the same (at least once)."""
    from confluent_kafka import Consumer, TopicPartition

    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: 2, out: 2})
    ends = produce(kafka_bootstrap, inp, table_updates(2_000, keys=300, seed=3))

    def run(state):
        w = Worker(apps.filter_topology(), kafka_bootstrap, app, tmp_path / state,
                   consumer_config=TEST_CONSUMER_CONFIG)
        w.run(until_drained=True, install_signal_handlers=False)
        return w

    assert run("first").records_processed == 2_000
    conf = kafka.consumer_defaults(kafka_bootstrap)
    conf["group.id"] = app
    c = Consumer(conf)   # the group is empty: a plain offset commit sets it back
    try:
        c.commit(offsets=[TopicPartition(inp, p, 10) for p in range(2)], asynchronous=False)
    finally:
        c.close()
    assert committed_offsets(kafka_bootstrap, app, inp, 2) == {0: 10, 1: 10}
    outputs = len(kafka.read_topic(kafka_bootstrap, out))
    # (running, not until drained: the catch-up is an idle commit's, retried every commit
    # interval; a worker's last commit before it leaves can still be lost, see docs/operations.md)
    second = Worker(apps.filter_topology(), kafka_bootstrap, app, tmp_path / "second",
                    consumer_config=TEST_CONSUMER_CONFIG)
    t = threading.Thread(target=second.run, kwargs={"install_signal_handlers": False})
    t.start()
    try:
        wait_for(lambda: committed_offsets(kafka_bootstrap, app, inp, 2) == ends, 60,
                 "the group's offsets to reach the ends")
    finally:
        second.stop()
        t.join(60)
    assert second.records_processed == 0   # resumed from the changelogs' positions, not the group's
    assert len(kafka.read_topic(kafka_bootstrap, out)) == outputs


_DRAIN_ONCE = """
import logging, sys
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
w = Worker(apps.filter_topology(), sys.argv[1], sys.argv[2], sys.argv[3], consumer_config=TEST_CONSUMER_CONFIG)
w.run(until_drained=True, install_signal_handlers=False)
print(w.records_processed)
"""


def test_a_run_until_drained_frozen_past_its_session_ends_with_its_offsets_committed(apache_kafka_bootstrap,
                                                                                     unique, tmp_path):
    """A worker run until drained, frozen (SIGSTOP, by the test hook) at its first commit with
    records for longer than its session: the group expelled it, so the commit it sends on thawing
    is refused. It still ends with the group's offsets at the ends: drained means committed, and
    it rejoins, restores and commits the positions before it stops."""
    import os
    import subprocess
    import sys
    import time

    kafka_bootstrap = apache_kafka_bootstrap   # Apache Kafka's session expiry, whatever the run's broker
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 2, out: 2})
    ends = produce(kafka_bootstrap, inp, table_updates(2_000, keys=300, seed=5))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, APP_INPUT=inp, APP_OUTPUT=out, PROCESSOR_TEST_STOP_BEFORE_COMMIT="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log_file:
        p = subprocess.Popen([sys.executable, "-c", _DRAIN_ONCE, kafka_bootstrap, app, str(tmp_path / "state")],
                             cwd=root, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True)
    try:
        def frozen():
            with open(f"/proc/{p.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "T"
        wait_for(frozen, 120, "the worker frozen by the test hook", procs=[(p, log_path)])
        time.sleep(TEST_CONSUMER_CONFIG["session.timeout.ms"] / 1000 + 4)   # expelled by now
        p.send_signal(signal.SIGCONT)
        processed, _ = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    log_text = open(log_path).read()
    assert p.returncode == 0, log_text[-3000:]
    assert "lost " in log_text or "refused" in log_text, log_text[-3000:]   # the expulsion was seen
    assert committed_offsets(kafka_bootstrap, app, inp, 2) == ends, log_text[-3000:]
    assert int(processed) >= 2_000
