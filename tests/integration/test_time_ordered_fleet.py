"""The backlog of ``test_time_ordered_backlog.py`` (issue 34), larger (2,000 users, 4,000 join
pairs of records), read by a fleet: three worker processes (`processor run`) over 4 partitions,
the history produced before any of them starts; the first, started alone, is SIGKILLed by the test
hook at its second commit with records (outputs flushed, nothing committed) while the other two
join, and started again on its state directory.

Every click joins the region of its time and every pair meets (the model); per key the outputs,
their replays after the crash aside (at least once: a killed unit's outputs are sent again), are
exactly the time-ordered driver's, in order; the table store of every task (its last owner's
copy) is the driver's byte for byte."""

import json
import signal
import subprocess

import pytest

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    by_key,
    latest_task_dirs,
    start_worker_process,
    task_store_bytes,
    wait_for,
    wait_until_group_drained,
)
from tests.integration.test_time_ordered_backlog import (
    driver_by_partition,
    history,
    model_enriched,
    model_pairs,
    pairs_of,
    produce_history,
    topology_for,
)

PARTS = 4


def first_occurrences(seq):
    seen, out = set(), []
    for r in seq:
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def test_a_fleet_with_a_sigkill_over_a_backlog_processes_in_time_order(kafka_bootstrap, unique, tmp_path, report):
    t = {n: f"tof-{n}-{unique}" for n in ("users", "clicks", "enriched", "left", "right", "pairs")}
    kafka.create_topics(kafka_bootstrap, {v: PARTS for v in t.values()})
    h = history(users_n=2000, steps=200)
    produce_history(kafka_bootstrap, t, h)
    app = f"tof-{unique}"
    env = {"TOB_TOPICS": json.dumps(t)}
    spec = "tests.integration.backlog_apps:backlog_topology"
    dirs = [tmp_path / f"w{i}" for i in range(3)]
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start_worker_process(kafka_bootstrap, spec, app, dirs[0], logs[0],
                                  {**env, "PROCESSOR_TEST_KILL_BEFORE_COMMIT": "2"})]
    try:
        # Worker 0 takes the backlog before the others start: started together, the others could
        # process all of it while worker 0 only warmed up a standby (Apache Kafka, a loaded machine),
        # and it never reached a 2nd commit with records.
        wait_for(lambda: procs[0].poll() is not None or "processor.worker: assigned" in open(logs[0]).read(),
                 120, "worker 0's first assignment")
        procs += [start_worker_process(kafka_bootstrap, spec, app, dirs[i], logs[i], env) for i in (1, 2)]
        try:
            code = procs[0].wait(300)
        except subprocess.TimeoutExpired:
            pytest.fail("worker 0 never reached its 2nd commit in 300 s:\n" + open(logs[0]).read()[-3000:])
        assert code == -signal.SIGKILL, open(logs[0]).read()[-3000:]
        procs[0] = start_worker_process(kafka_bootstrap, spec, app, dirs[0], logs[0], env)
        waited = wait_until_group_drained(kafka_bootstrap, app,
                                          {t[n]: PARTS for n in ("users", "clicks", "left", "right")},
                                          timeout_s=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except Exception:
                p.kill()
    got = {o: by_key(kafka.read_topic(kafka_bootstrap, t[o], isolation_level="read_uncommitted"))
           for o in ("enriched", "pairs")}
    replays = sum(len(seq) - len(first_occurrences(seq)) for o in got.values() for seq in o.values())
    got = {o: {k: first_occurrences(seq) for k, seq in g.items()} for o, g in got.items()}
    assert {k: [(json.loads(v), ts) for v, ts in seq] for k, seq in got["enriched"].items()} == model_enriched(h)
    pairs = model_pairs(h)
    assert pairs_of(got["pairs"]) == pairs
    inputs = {name: kafka.read_topic(kafka_bootstrap, t[name]) for name in ("users", "clicks", "left", "right")}
    want, stored = driver_by_partition(t, inputs, PARTS, app, False)
    assert got == want
    sub = topology_for(t).subtopology_of_topic()[t["users"]]
    last = latest_task_dirs(dirs_app := [d / app for d in dirs])
    for part in range(PARTS):
        assert task_store_bytes([last[f"task-{sub}_{part}"]], ["users"]) == stored[part], part
    owners = {d.parent.name: sum(1 for _ in d.glob("task-*")) for d in dirs_app}
    report(f"fleet backlog: {sum(len(v) for v in h.values())} records, 3 workers (tasks per state dir {owners}), "
           f"1 SIGKILL at the 2nd commit; {sum(map(len, want['enriched'].values()))} enriched, "
           f"{len(pairs)} pairs, {replays} outputs replayed after the crash; drained in {waited:.1f} s")
