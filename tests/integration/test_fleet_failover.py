"""Failover of a fleet on the real broker (issue 36): two worker processes count events per key over
6 partitions; one is SIGKILLed; the survivor takes its tasks over.

With ``--num-standby-replicas 1`` the survivor already holds a copy of every task the killed worker
ran, so it reads only the changelog tail its copy has not seen; without, it reads each moved task's
whole changelog. Both ways, under both processing guarantees, the final counts equal the
broker-free driver's for every key, and the survivor ends up running every task.

Figures reported: the changelog records the survivor read to take the tasks over against the
records those changelogs hold, and the seconds from the kill to the survivor's first output of a
moved partition.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from processor.kafka import clients as kafka
from processor.kafka.partition_ends import snapshot_end_offsets
from processor.runtime.local_broker import free_port
from tests.integration import apps
from tests.integration.helpers import (
    assigned_partitions_now,
    final_table,
    kill_leftover_workers,
    produce_with_partitioner,
    start_worker_process,
    stop_workers,
    wait_for,
    wait_until_tasks_committed,
)

SPEC = "tests.integration.apps:counts_topology"
PARTS = 6
KEYS = 30_000


def _events(keys: range, round_: int) -> list[tuple[str, bytes, bytes]]:
    return [("", f"k{i:06d}".encode(), json.dumps({"r": round_}).encode()) for i in keys]



def _ends(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """Every partition's end (its EOF offset, read uncommitted), found by fetching: Tansu's
    latest-offset answer (``get_watermark_offsets(cached=False)``) is the last batch's base offset
    + 1, which made a changelog of big batches look ~25% shorter than it is
    (``processor/kafka/partition_ends.py``)."""
    return snapshot_end_offsets(bootstrap, topics, consumer_config={"isolation.level": "read_uncommitted"})


def _first_record_after(bootstrap: str, starts: dict[tuple[str, int], int], timeout_s: float) -> float | None:
    """When the first record at or after ``starts`` (per partition) arrived, or None."""
    conf = kafka.consumer_defaults(bootstrap)
    conf.update({"group.id": f"first-{time.time_ns()}", "isolation.level": "read_uncommitted",
                 "fetch.wait.max.ms": 10, "auto.offset.reset": "earliest"})
    c = Consumer(conf)
    try:
        c.assign([TopicPartition(t, p, off) for (t, p), off in starts.items()])
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if any(m.error() is None for m in c.consume(100, 0.05)):
                return time.time()
        return None
    finally:
        c.close()


def _restored(log_text: str) -> int:
    return sum(int(n) for n in re.findall(r", (\d+) changelog records read;", log_text))


@pytest.mark.parametrize("standbys", [1, 0])
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_one_of_two_workers_survivor_takes_over(kafka_bootstrap, unique, tmp_path, monkeypatch, report,
                                                         guarantee, standbys):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"failover-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    isolation = "read_uncommitted"
    history = [(inp, k, v) for _, k, v in _events(range(KEYS), 0)]
    produce_with_partitioner(kafka_bootstrap, history, "murmur2_random")   # before the workers start
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                  consumer_config=[f"isolation.level={isolation}"],
                                  extra_args=["--num-standby-replicas", str(standbys),
                                              "--http-port", str(free_port())]) for i in range(2)]
    try:
        def both_run_tasks():
            now = [assigned_partitions_now(open(log).read()) for log in logs]
            return all(now) and len(now[0] | now[1]) == PARTS

        wait_for(both_run_tasks, 90, "both workers run tasks", list(zip(procs, logs, strict=True)))
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180)
        time.sleep(3)   # standby passes (every second) reach the last commit
        victim, survivor = 0, 1
        moved = assigned_partitions_now(open(logs[victim]).read())
        changelogs = sorted(topo.changelogs_of(0).values())
        out_before = _ends(kafka_bootstrap, [out])
        before = _restored(open(logs[survivor]).read())
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        killed_at = time.time()
        # what the moved tasks' changelogs hold (every store's, the task's own included), measured
        # with the victim dead: nothing but the survivor writes them from now on, and it restores
        # them first (it learns they are its own after the session timeout)
        held = {}
        for (_, p), n in _ends(kafka_bootstrap, changelogs).items():
            held[p] = held.get(p, 0) + n
        tail = [(inp, k, v) for _, k, v in _events(range(0, KEYS, 7), 1)]
        produce_with_partitioner(kafka_bootstrap, tail, "murmur2_random")
        # the first output of a moved partition after the kill
        first_moved = _first_record_after(kafka_bootstrap, {(out, p): out_before[(out, p)] for p in moved},
                                          120 - (time.time() - killed_at))
        wait_for(lambda: assigned_partitions_now(open(logs[survivor]).read()) >= set(range(PARTS)), 120,
                 "the survivor runs every task", [(procs[survivor], logs[survivor])])
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180)
        read = _restored(open(logs[survivor]).read()) - before

        outputs = kafka.read_topic(kafka_bootstrap, out)
        want = {}
        for _, k, _ in history + tail:
            want[k] = want.get(k, 0) + 1
        got = {k: json.loads(v) for k, v in final_table(outputs).items()}
        assert got == want
        assert first_moved is not None, "no output of a moved partition within 120 s of the kill"
        stop_workers([procs[survivor]], [logs[survivor]])
    finally:
        kill_leftover_workers([p for p in procs])
    holds = sum(n for p, n in held.items() if p in moved)
    report(f"{guarantee}, {standbys} standby: the survivor read {read} changelog records to take over "
           f"{len(moved)} tasks whose changelogs hold {holds} ({100 * read / holds:.1f}%); first output of a "
           f"moved partition {first_moved - killed_at:.1f} s after the kill")
    # a restore reads each changelog record once at most (a tail past the last commit record of a
    # store changelog is not counted; transaction markers take offsets but are not records)
    assert read <= holds, (read, holds)
    if standbys:
        assert read < 0.05 * holds, (read, holds)
    else:
        assert read >= 0.9 * holds, (read, holds)
