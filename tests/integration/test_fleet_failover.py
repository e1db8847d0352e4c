"""Failover of a fleet on the real broker (issue 36): two worker processes count events per key over
6 partitions; one is SIGKILLed; the survivor takes its tasks over.

With ``--num-standby-replicas 1`` the survivor already holds a copy of every task the killed worker
ran, so it reads only the changelog tail its copy has not seen; without, it reads each moved task's
whole changelog. Both ways, under both processing guarantees, the final counts equal the
broker-free driver's for every key, and the survivor ends up running every task.

Figures reported: the changelog records the survivor read to take the tasks over against the
records those changelogs hold, and the seconds from the kill to the survivor's first output of a
moved partition.

Then one of THREE workers (1 standby) is SIGKILLed while events keep arriving: the two survivors
take its tasks over from their standbys (under 5 % of what those changelogs hold read), end with
3 tasks each, and the final counts equal the events produced, history and load.
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
    FirstNewRecords,
    SteadyLoad,
    assigned_partitions_now,
    final_table,
    kill_leftover_workers,
    produce_with_partitioner,
    start_worker_process,
    stop_workers,
    wait_for,
    wait_until_tasks_committed,
    worker_isolation_level,
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


def _first_record_after(bootstrap: str, starts: dict[tuple[str, int], int], timeout_s: float,
                        isolation_level: str) -> float | None:
    """When the first record at or after ``starts`` (per partition) arrived for a consumer reading
    with ``isolation_level`` (read_committed: once its transaction committed), or None."""
    conf = kafka.consumer_defaults(bootstrap)
    conf.update({"group.id": f"first-{time.time_ns()}", "isolation.level": isolation_level,
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


def _ever_assigned(log_text: str) -> set[int]:
    """The partition numbers of every "assigned" line of a worker log."""
    return {int(p) for ln in log_text.splitlines() if "processor.worker: assigned" in ln
            for p in re.findall(r"\[(\d+)\]@", ln)}


def _restored(log_text: str) -> int:
    return sum(int(n) for n in re.findall(r", (\d+) changelog records read;", log_text))


def _held(bootstrap: str, topo, partitions) -> int:
    """The records the changelogs of the tasks of ``partitions`` hold (every store's, the task's own
    included): their end offsets, found by fetching (Tansu's watermarks are the last batch's base
    offset + 1, and 0 on a partition with a transaction left open)."""
    ends = snapshot_end_offsets(bootstrap, list(topo.changelogs_of(0).values()))
    return sum(n for (_, p), n in ends.items() if p in partitions)


@pytest.mark.parametrize("standbys", [1, 0])
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_one_of_two_workers_survivor_takes_over(kafka_bootstrap, broker_capabilities, unique, tmp_path,
                                                         monkeypatch, report, guarantee, standbys):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"failover-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    # docs/semantics.md "Isolation level": exactly once reads read_committed where the broker
    # completes and hides transactions (a read_uncommitted worker would restore the changelog
    # records and commit record of an aborted transaction, and keep state whose outputs were
    # aborted), read_uncommitted on Tansu; the outputs are read the same way
    isolation = worker_isolation_level(guarantee, broker_capabilities)
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
        # (a moved task the survivor ran itself during the start-up rounds has local state there:
        # its restore starts from that checkpoint, not from the beginning)
        ran_before = moved & _ever_assigned(open(logs[survivor]).read())
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
        # of which a restore at the workers' isolation level can read (read_committed: not the
        # records of aborted transactions, which commits fenced during the start-up rounds leave)
        readable = sum(1 for c in changelogs for m in kafka.read_topic(kafka_bootstrap, c, isolation_level=isolation)
                       if m.partition() in moved)
        tail = [(inp, k, v) for _, k, v in _events(range(0, KEYS, 7), 1)]
        produce_with_partitioner(kafka_bootstrap, tail, "murmur2_random")
        # the first output of a moved partition after the kill
        first_moved = _first_record_after(kafka_bootstrap, {(out, p): out_before[(out, p)] for p in moved},
                                          120 - (time.time() - killed_at), isolation)
        wait_for(lambda: assigned_partitions_now(open(logs[survivor]).read()) >= set(range(PARTS)), 120,
                 "the survivor runs every task", [(procs[survivor], logs[survivor])])
        assert assigned_partitions_now(open(logs[survivor]).read()) == set(range(PARTS))   # all 6, nothing else
        # (read_committed: and no transaction left open on the outputs, the victim's included)
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180, settled=[out])
        read = _restored(open(logs[survivor]).read()) - before

        outputs = kafka.read_topic(kafka_bootstrap, out, isolation_level=isolation)
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
    report(f"{guarantee}, {standbys} standby (reading {isolation}): the survivor read {read} changelog records "
           f"to take over "
           f"{len(moved)} tasks whose changelogs hold {holds} ({100 * read / holds:.1f}%; {readable} readable "
           f"at {isolation}); first output of a moved partition {first_moved - killed_at:.1f} s after the kill"
           + (f"; the survivor had run moved task(s) of partition(s) {sorted(ran_before)} before" if ran_before
              else ""))
    # a restore reads each changelog record once at most (a tail past the last commit record of a
    # store changelog is not counted; transaction markers take offsets but are not records)
    assert read <= holds, (read, holds)
    if standbys:
        assert read < 0.05 * holds, (read, holds)
    elif not ran_before:
        assert read >= 0.9 * readable, (read, readable, holds)
    else:
        assert read > 0, (read, sorted(ran_before))


def _standbys_now(log_text: str) -> set[int]:
    """The partition numbers of a worker log's last "standby replicas:" line (every standby it keeps)."""
    lines = [ln for ln in log_text.splitlines() if "processor.standby: standby replicas:" in ln]
    return {int(p) for p in re.findall(r"\d+_(\d+)", lines[-1].split("standby replicas:")[1])} if lines else set()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_one_of_three_workers_under_load(kafka_bootstrap, broker_capabilities, unique, tmp_path, monkeypatch,
                                                report, guarantee):
    """Three workers with 1 standby each count 30,000 keys of history over 6 partitions, then
    events keep arriving (12 every 50 ms, over all partitions) while one worker is SIGKILLed and
    after: the two survivors take its 2 tasks over from their standbys (reading less than 5 % of
    what those tasks' changelogs hold), end with 3 tasks each, and the final count of every key
    equals the events produced for it."""
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"failover3-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    # The victim dies in the middle of a transaction (exactly once, under load), which its
    # transactional id never aborts (it does not come back). Where the broker leaves such a
    # transaction open for good (Tansu: no transaction timeout; probe
    # transactions_complete_after_fencing), the last stable offset of every partition it wrote
    # stays in front of it, so read_committed would stop there: the workers and this test read
    # uncommitted (the survivors write every key of that transaction again, later in the partition).
    isolation = worker_isolation_level(guarantee, broker_capabilities)
    history = [(inp, k, v) for _, k, v in _events(range(KEYS), 0)]
    produce_with_partitioner(kafka_bootstrap, history, "murmur2_random")   # before the workers start
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                  consumer_config=[f"isolation.level={isolation}"],
                                  extra_args=["--num-standby-replicas", "1",
                                              "--http-port", str(free_port())]) for i in range(3)]
    load = SteadyLoad(kafka_bootstrap, inp, [f"k{i:06d}" for i in range(KEYS)], stride=KEYS // 12)
    victim, survivors = 1, [0, 2]
    new_outputs = None

    def now(i):
        return assigned_partitions_now(open(logs[i]).read())

    def balanced(workers):
        def check():
            got = [now(i) for i in workers]
            sizes = sorted(len(g) for g in got)
            return (sizes[-1] - sizes[0] <= 1 and sum(sizes) == PARTS
                    and set().union(*got) == set(range(PARTS)))
        return check

    try:
        wait_for(balanced(range(3)), 120, "2 tasks on each of 3 workers", list(zip(procs, logs, strict=True)))
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180)
        load.start()
        time.sleep(4)   # standby passes (every second) follow the load
        moved = now(victim)
        standbys = {i: _standbys_now(open(logs[i]).read()) for i in survivors}
        assert moved <= standbys[0] | standbys[2], (moved, standbys)   # each moved task has a standby copy
        holds = _held(kafka_bootstrap, topo, moved)
        before = {i: _restored(open(logs[i]).read()) for i in survivors}
        warmups_before = {i: open(logs[i]).read().count("warm-up replicas") for i in survivors}
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        killed_at = time.monotonic()
        new_outputs = FirstNewRecords(kafka_bootstrap, out, moved).start()   # (the victim adds nothing now)
        assert new_outputs.ready.wait(60), new_outputs.errors
        assert not balanced(survivors)(), "the survivors took over before the outputs' ends were known"
        wait_for(balanced(survivors), 180, "3 tasks on each survivor",
                 [(procs[i], logs[i]) for i in survivors])
        settled_at = time.monotonic()
        wait_for(lambda: len(new_outputs.first) == len(moved), 120, "outputs of every moved partition",
                 [(procs[i], logs[i]) for i in survivors])
        time.sleep(3)   # events keep arriving after the takeover
        produced = load.stop()
        # (read_committed: and no transaction left open on the outputs, the victim's included: the
        # broker aborts it at its transaction.timeout.ms, 60 s after it began)
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, isolation, timeout_s=180, settled=[out])
        read = sum(_restored(open(logs[i]).read()) - before[i] for i in survivors)
        warmups = sum(open(logs[i]).read().count("warm-up replicas") - warmups_before[i] for i in survivors)
        after = {i: now(i) for i in survivors}
        first_out = dict(new_outputs.first)

        want: dict[bytes, int] = {}
        for _, k, _ in history + produced:
            want[k] = want.get(k, 0) + 1
        got = {k: json.loads(v) for k, v in final_table(kafka.read_topic(kafka_bootstrap, out,
                                                                          isolation_level=isolation)).items()}
        assert got == want
        behind = None   # keys a read_committed reader sees behind (exactly once: the open transaction's effect)
        if guarantee == "exactly_once":
            committed = final_table(kafka.read_topic(kafka_bootstrap, out, isolation_level="read_committed"))
            behind = sum(1 for k, n in want.items() if k not in committed or json.loads(committed[k]) != n)
        assert balanced(survivors)(), after
        stop_workers([procs[i] for i in survivors], [logs[i] for i in survivors])
    finally:
        load.stop(check=False)
        if new_outputs is not None:
            new_outputs.stop()
        kill_leftover_workers(procs)
    report(f"{guarantee}, 1 standby, 3 workers (reading {isolation}): the survivors read {read} changelog records "
           f"to take over {len(moved)} tasks ({sorted(moved)}; standbys at the kill {standbys}) whose changelogs "
           f"hold {holds} ({100 * read / holds:.1f}%); first output of a moved partition "
           f"{min(first_out.values()) - killed_at:.1f} s after the kill (of each: "
           f"{ {p: round(t - killed_at, 1) for p, t in first_out.items()} }); assignment balanced "
           f"{settled_at - killed_at:.1f} s after the kill ({after}); warm-ups caught up after the kill: {warmups}; "
           f"{len(produced)} events arrived under load (history {len(history)})"
           + (f"; a read_committed reader sees {behind} keys behind" if behind is not None else ""))
    assert read < 0.05 * holds, (read, holds)
