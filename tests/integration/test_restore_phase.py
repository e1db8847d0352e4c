"""Restore is a phase of the main loop (issue 14 item 2): a restore that takes longer than
``max.poll.interval.ms`` costs no rebalance, and the tasks that need no restore keep processing
meanwhile.

A worker process builds the state of a 4-partition table, stops; the state directories of three
of its four tasks are wiped; more records arrive on every partition; the worker starts again
with ``max.poll.interval.ms=6000`` and a restore slowed to last longer than that (test hook
``PROCESSOR_TEST_RESTORE_STEP_DELAY_MS``). Then: one assignment only (no rebalance), the restore
took longer than ``max.poll.interval.ms``, the open task processed records during it, and the
output topic read as a table equals the input's final table."""

import json
import re
import shutil
import time

from processor.kafka import clients as kafka
from tests.integration import apps
from tests.integration.helpers import (
    final_table,
    key_partition,
    kill_leftover_workers,
    produce,
    start_worker_process,
    stop_workers,
    wait_until_tasks_committed,
)

PARTS = 4
SPEC = "tests.integration.apps:restore_topology"
MAX_POLL_MS = 6000


def _records(n, keys, seed):
    return [(f"k{(i * 7919 + seed) % keys:05d}".encode(), json.dumps({"i": i, "seed": seed}).encode())
            for i in range(n)]


def _run_until_committed(bootstrap, app, state, log, env, inputs, conf=()):
    p = start_worker_process(bootstrap, SPEC, app, state, log, env, consumer_config=list(conf))
    try:
        topo = apps.restore_topology().for_application(app)

        def alive():
            assert p.poll() is None, open(log).read()[-3000:]
        wait_until_tasks_committed(bootstrap, topo, {inputs: PARTS}, "read_uncommitted", timeout_s=180, check=alive)
        stop_workers([p], [log])
    finally:
        kill_leftover_workers([p])


def test_a_restore_longer_than_max_poll_interval_costs_no_rebalance(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                                    report):
    inp, out, app = f"in-{unique}", f"out-{unique}", f"restore-{unique}"
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    first = _records(40_000, 20_000, 1)
    produce(kafka_bootstrap, inp, first)
    state, log1, log2 = tmp_path / "state", tmp_path / "w1.log", tmp_path / "w2.log"
    _run_until_committed(kafka_bootstrap, app, state, log1, env, inp)
    for p in (1, 2, 3):
        shutil.rmtree(state / app / f"task-0_{p}")
    # more records on every partition, some of them for partition 0 (the task that needs no restore)
    more = _records(2_000, 20_000, 2)
    assert {key_partition(k, PARTS) for k, _ in more} == set(range(PARTS))
    produce(kafka_bootstrap, inp, more, timestamp0=2_000_000)
    monkeypatch.setenv("PROCESSOR_TEST_RESTORE_STEP_DELAY_MS", "1000")
    t0 = time.monotonic()
    _run_until_committed(kafka_bootstrap, app, state, log2, env, inp,
                         conf=[f"max.poll.interval.ms={MAX_POLL_MS}"])
    text = open(log2).read()
    assigned = re.findall(r"processor\.worker: assigned (.*)", text)
    resumed = re.findall(r"restored and resumed (.*) after ([\d.]+) s, \d+ changelog records read; "
                         r"meanwhile the open tasks processed (\d+) records", text)
    assert len(resumed) == 2, text[-3000:]    # task 0_0 (local state) first, then the three wiped ones
    assert "[0]@" in resumed[0][0] and "[0]@" not in resumed[1][0], resumed
    m = re.search(re.escape(resumed[1][0]) + r" after ([\d.]+) s, \d+ changelog records read; meanwhile the open "
                  r"tasks processed (\d+) records",
                  text)
    restore_s, meanwhile = float(m.group(1)), int(m.group(2))
    restored = sum(int(n) for n in re.findall(r"restored task 0_[123] from its changelogs: (\d+) records", text))
    report(f"restore of {restored} records into 3 wiped tasks (slowed by the test hook) took {restore_s:.1f} s "
           f"with max.poll.interval.ms={MAX_POLL_MS}: {len(assigned)} assignment(s), the open task processed "
           f"{meanwhile} records meanwhile; run {time.monotonic() - t0:.1f} s")
    assert len(assigned) == 1, assigned                       # no rebalance
    assert "restoring" in assigned[0] and "poll interval" not in text and "revoked" not in text.lower()
    assert restore_s * 1000 > MAX_POLL_MS
    assert restored > 10_000
    assert meanwhile == sum(key_partition(k, PARTS) == 0 for k, _ in more)   # task 0_0's new records
    # progress per task in the log while it runs: "restoring: ... (per task: 0_1 3000/6400, ...)"
    progress = re.findall(r"restoring: \d+ records restored, \d+ records/s, \d+ remaining \(per task: (.*)\)", text)
    assert progress and all(re.fullmatch(r"0_[123] \d+/\d+(, 0_[123] \d+/\d+){2}", p) for p in progress), progress
    want = {}
    for k, v in first + more:
        want[k] = v
    assert final_table(kafka.read_topic(kafka_bootstrap, out)) == want
