"""Broker failures under load (issue 46): a three-node Apache Kafka cluster (replication factor 3,
``min.insync.replicas=2``; Apache Kafka whatever the run's broker), two worker processes counting events per key
(``apps.counts_topology``: every input record gives one output record, the key's new count) while
events arrive paced, under both guarantees; then

- ``leader-killed``: the node leading most of the input's partitions is SIGKILLed, 5 s into the
  input, and started again 10 s later;
- ``rolling-restart``: every node in turn is stopped (SIGTERM: a controlled shutdown) and started
  again, the next one once the restarted node's client port is open.

No worker may exit. Read as a downstream read_committed consumer reads it: under exactly once
every key's outputs are exactly ``1, 2, ..., n``; under at least once every key's outputs hold
each of ``1..n`` (replays may repeat some), the last one ``n``. Figures: the time the failures
took, doubled and missing outputs, the workers' logged Kafka errors."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka.admin import AdminClient

from processor.kafka import clients as kafka
from processor.runtime.apache_kafka import ApacheKafka
from tests.integration import apps
from tests.integration.helpers import (
    CountSequences,
    assigned_partitions_now,
    kill_leftover_workers,
    produce_count_rounds,
    start_worker_process,
    stop_workers,
    wait_for,
    wait_until_tasks_committed,
)

SPEC = "tests.integration.apps:counts_topology"
PARTS = 4
KEYS = 300
ROUNDS = 60          # events per key: 18,000 in all
PACE_S = 30.0


def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return {p: m.leader for p, m in meta.topics[topic].partitions.items()}


@pytest.mark.parametrize("failure", ["leader-killed", "rolling-restart"])
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_broker_failures_under_load_no_worker_exits_outputs_exact(unique, tmp_path, monkeypatch, report,
                                                                   guarantee, failure):
    with ApacheKafka(nodes=3, directory=tmp_path / "cluster") as cluster:
        _run_failure(cluster, unique, tmp_path, monkeypatch, report, guarantee, failure)


def _run_failure(cluster: ApacheKafka, unique, tmp_path, monkeypatch, report, guarantee, failure):
    bootstrap = cluster.bootstrap_servers
    inp, out, app = f"bev-{unique}", f"bcounts-{unique}", f"bfail-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(bootstrap, {inp: PARTS, out: PARTS}, replication_factor=3)
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [start_worker_process(bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee)
             for i in range(2)]
    alive = list(zip(procs, logs, strict=True))
    try:
        def both_run_tasks():
            now = [assigned_partitions_now(open(lg).read()) for lg in logs]
            return all(now) and len(now[0] | now[1]) == PARTS

        wait_for(both_run_tasks, 120, "both workers run tasks", alive)
        produced = [0]
        producer = threading.Thread(target=produce_count_rounds, args=(bootstrap, inp, KEYS, ROUNDS, PACE_S, produced),
                                    kwargs={"acks": "all", "enable.idempotence": True})
        producer.start()
        time.sleep(5.0)
        t0 = time.monotonic()
        if failure == "leader-killed":
            leaders = list(_leaders(bootstrap, inp).values())
            victim = max(set(leaders), key=leaders.count)
            cluster.kill(victim)
            time.sleep(10.0)
            for p, lg in alive:
                assert p.poll() is None, open(lg).read()[-4000:]
            cluster.start_node(victim, timeout_s=180)
            what = f"node {victim} (leader of {leaders.count(victim)} of {PARTS} input partitions) SIGKILLed for 10 s"
        else:
            for node in cluster.nodes:
                cluster.stop_node(node.node_id)
                cluster.start_node(node.node_id, timeout_s=180)
                for p, lg in alive:
                    assert p.poll() is None, open(lg).read()[-4000:]
            what = "3 nodes restarted in turn"
        failed_s = time.monotonic() - t0
        producer.join(180)
        assert not producer.is_alive()

        def check():
            for p, lg in alive:
                assert p.poll() is None, open(lg).read()[-4000:]

        isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
        drained_s = wait_until_tasks_committed(bootstrap, topo, {inp: PARTS}, isolation, timeout_s=240, check=check)
        check()
        text = "".join(open(lg).read() for lg in logs)
        stop_workers(procs, logs)
    finally:
        kill_leftover_workers(procs)

    got = CountSequences(bootstrap, out, KEYS, ROUNDS)
    report(f"{guarantee}, {failure}: {what}, {failed_s:.1f} s; drained {drained_s:.1f} s after the input; "
           f"outputs doubled {got.doubled}, missing {got.missing}; worker log lines: {text.count('WARNING')} warnings, "
           f"{text.count('transaction aborted')} aborted transaction(s), {text.count('restored task')} task restores")
    assert produced[0] == KEYS * ROUNDS
    assert got.missing == 0, got.differing()
    assert {k: v[-1] for k, v in got.counts.items()} == {k: ROUNDS for k in got.want}
    if guarantee == "exactly_once":
        assert got.doubled == 0
        assert got.counts == got.want
