"""Exactly once against a zombie (issue 46): a worker frozen (SIGSTOP) past its session timeout
while input flows, then thawed, with a transaction open.

Two worker processes count events per key (``apps.counts_topology``: every input record gives one
output record, the key's new count) over 4 partitions, ``exactly_once``. Events arrive paced for
~25 s; 4 s in, worker 0 is stopped for 15 s (session timeout 6 s): the group moves its tasks to
worker 1, which restores them from their changelogs (read_committed: the zombie's open
transaction is aborted for it or hides its records). Then worker 0 runs again, as a zombie: it
still believes it owns its tasks and tries to commit; Apache Kafka fences that commit (its group
generation is stale), the worker aborts, drops its tasks' uncommitted state and rejoins.

Asserted, read as a downstream ``read_committed`` consumer reads it: for every key the output
is exactly ``1, 2, ..., n`` with n its events (none doubled, none missing, in order), and both
workers are alive at the end. Figures: the outputs doubled and missing (goal 0 and 0), the
zombie's aborted transactions, and the time from the freeze to the first output of a moved
partition.

Runs on Apache Kafka whatever the run's broker (``apache_kafka_bootstrap``): Tansu neither
fences the zombie nor aborts its transaction."""

from __future__ import annotations

import os
import signal
import threading
import time

from processor.kafka import clients as kafka
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
KEYS = 400
ROUNDS = 50          # events per key: 20,000 in all
PACE_S = 25.0        # the time over which they arrive
FREEZE_AT_S = 4.0
FREEZE_S = 15.0      # session timeout 6 s (start_worker_process)


def test_zombie_worker_thawed_mid_transaction_outputs_exactly_once(apache_kafka_bootstrap, unique, tmp_path,
                                                                   monkeypatch, report):
    kafka_bootstrap = apache_kafka_bootstrap
    inp, out, app = f"zev-{unique}", f"zcounts-{unique}", f"zombie-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, "exactly_once")
             for i in range(2)]
    frozen = False
    try:
        def both_run_tasks():
            now = [assigned_partitions_now(open(lg).read()) for lg in logs]
            return all(now) and len(now[0] | now[1]) == PARTS

        wait_for(both_run_tasks, 90, "both workers run tasks", list(zip(procs, logs, strict=True)))
        moved = assigned_partitions_now(open(logs[0]).read())
        stop, produced = threading.Event(), [0]
        producer = threading.Thread(target=produce_count_rounds,
                                    args=(kafka_bootstrap, inp, KEYS, ROUNDS, PACE_S, produced, stop))
        producer.start()
        time.sleep(FREEZE_AT_S)
        os.kill(procs[0].pid, signal.SIGSTOP)
        frozen, frozen_at = True, time.monotonic()

        def survivor_runs_all():
            return assigned_partitions_now(open(logs[1]).read()) == set(range(PARTS))

        wait_for(survivor_runs_all, FREEZE_S + 60, "worker 1 to run every task", [(procs[1], logs[1])])
        took_over_s = time.monotonic() - frozen_at
        time.sleep(max(0.0, frozen_at + FREEZE_S - time.monotonic()))
        os.kill(procs[0].pid, signal.SIGCONT)
        frozen = False
        producer.join(120)
        assert not producer.is_alive()
        alive = list(zip(procs, logs, strict=True))

        def check():
            for p, lg in alive:
                assert p.poll() is None, open(lg).read()[-4000:]

        drained_s = wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, "read_committed",
                                               timeout_s=180, check=check)
        assert all(p.poll() is None for p in procs), "a worker exited"
        stop_workers(procs, logs)
    finally:
        if frozen:
            os.kill(procs[0].pid, signal.SIGCONT)
        kill_leftover_workers(procs)

    got = CountSequences(kafka_bootstrap, out, KEYS, ROUNDS)
    zombie_log = open(logs[0]).read()
    aborted = zombie_log.count("transaction aborted")
    report(f"{produced[0]:,} events over {PACE_S:.0f} s, worker 0 (tasks {sorted(moved)}) frozen {FREEZE_S:.0f} s: "
           f"worker 1 ran every task {took_over_s:.1f} s after the freeze; outputs doubled {got.doubled}, missing "
           f"{got.missing}; the zombie aborted {aborted} transaction(s); drained {drained_s:.1f} s after the input")
    assert produced[0] == KEYS * ROUNDS
    assert got.doubled == 0 and got.missing == 0, got.differing()
    assert got.counts == got.want
