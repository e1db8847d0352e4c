"""Crash test on a real broker: a worker process SIGKILLs itself (test hook
``PROCESSOR_TEST_KILL_BEFORE_COMMIT``) after forwarding and flushing outputs but before committing
state and offsets, then a fresh worker resumes with the same state directory.

Emit-on-change must lose nothing (Kafka Streams turned KIP-557 off because a replay after such a
crash met an already-updated store and swallowed the emission): here the store, the last-emitted
column and the input offsets are committed as one unit, so a replayed record emits again. The
broker's output per key is exactly what was forwarded before the crash followed by the driver's
output for every record from the committed offset on (the replayed ones are the duplicates), and
the sums per region, whose records cross a repartition topic twice during the replay, are exact:
the receiving task drops the replayed repartition records by their provenance header."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

from processor import provenance
from processor.runtime import kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (by_key, committed_offsets, driver_outputs_by_key, produce,
                                       skewed_events)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 40_000
BACKLOG = 10_000
CHUNK = 1_000
KILL_AT_COMMIT = 3


def start_worker_process(bootstrap, app, state, env, log):
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "processor.cli", "--log-level", "INFO", "run",
         "tests.integration.apps:crash_aggregates_topology", "--bootstrap-servers", bootstrap,
         "--application-id", app, "--state-dir", str(state), "--commit-interval-ms", "200",
         "--consumer-config", "session.timeout.ms=6000", "--consumer-config", "heartbeat.interval.ms=500"],
        cwd=ROOT, env=e, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_sigkill_between_forward_and_commit_loses_no_emission(kafka_bootstrap, unique, tmp_path, monkeypatch,
                                                              report):
    inp, prefix, app = f"events-{unique}", f"crash-{unique}", f"app-{unique}"
    level, by_region = f"{prefix}-level", f"{prefix}-sum-by-region"
    repartition = f"{app}-sum-by-region-repartition"
    env = {"APP_INPUT": inp, "APP_OUTPUT_PREFIX": prefix}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {inp: 4, level: 4, by_region: 4})
    records = skewed_events(N, keys=1_000, seed=7)
    # Record i at timestamp 1_000_000 + i. A backlog first; the rest arrives while the worker runs
    # (and after it died), so the crash falls mid-stream: the restart replays and goes on.
    ends = produce(kafka_bootstrap, inp, records[:BACKLOG])

    # 1. The worker kills itself at its third commit with new records: outputs flushed, nothing committed.
    log = tmp_path / "worker.log"
    proc = start_worker_process(kafka_bootstrap, app, tmp_path / "state",
                                {**env, "PROCESSOR_TEST_KILL_BEFORE_COMMIT": str(KILL_AT_COMMIT)}, log)
    try:
        wait_for(lambda: "processor.worker: assigned" in open(log).read() or proc.poll() is not None,
                 60, "the worker's assignment")
        for i in range(BACKLOG, N, CHUNK):
            for p, end in produce(kafka_bootstrap, inp, records[i:i + CHUNK], timestamp0=1_000_000 + i).items():
                ends[p] = max(ends.get(p, 0), end)
            time.sleep(0.1)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == -signal.SIGKILL, open(log).read()[-3000:]
    assert "test hook: SIGKILL after forwarding, before committing" in open(log).read()
    assert sum(ends.values()) == N

    input_messages = kafka.read_topic(kafka_bootstrap, inp)
    position = {m.timestamp()[1]: (m.partition(), m.offset()) for m in input_messages}
    assert len(position) == N   # timestamps identify input records
    committed = committed_offsets(kafka_bootstrap, app, inp, 4)
    committed = {p: max(off, 0) for p, off in committed.items()}
    assert 0 < sum(committed.values()) < N   # some commits happened, the rest is replayed

    # The crash hit between forwarding and committing: outputs of records beyond the committed
    # offsets are on the broker, in the output topic and in the repartition topic.
    before = by_key(kafka.read_topic(kafka_bootstrap, level))
    uncommitted_out = [ts for seq in before.values() for _, ts in seq
                       if position[ts][1] >= committed[position[ts][0]]]
    assert uncommitted_out, (committed, ends)
    uncommitted_repartition = processed_before_crash = 0
    for m in kafka.read_topic(kafka_bootstrap, repartition):   # one record per input record
        src = provenance.decode(provenance.find(m.headers()))
        assert src.topic == inp
        uncommitted_repartition += src.offset >= committed[src.partition]
        processed_before_crash += 1
    assert uncommitted_repartition > 0
    assert processed_before_crash < N   # mid-stream: after the restart, replay and then new records

    # 2. Restart without the hook, same state directory and group, until drained.
    w = Worker(apps.crash_aggregates_topology(), kafka_bootstrap, app, tmp_path / "state",
               commit_interval_ms=200, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert committed_offsets(kafka_bootstrap, app, inp, 4) == {p: ends[p] for p in range(4)}
    replayed = N - sum(committed.values())
    assert w.metrics()["task"]["duplicates_dropped"] > 0   # replayed repartition records dropped

    # 3. The level per user (on_change): per key, exactly what went out before the crash, then the
    # driver's output for every record from the committed offset on. Nothing lost.
    got = by_key(kafka.read_topic(kafka_bootstrap, level))
    want = driver_outputs_by_key(apps.crash_aggregates_topology, inp, [level], input_messages)[level]
    assert sum(map(len, want.values())) > N // 2
    lost = [k for k in want if not is_subsequence(want[k], got.get(k, []))]
    assert lost == []
    assert set(got) == set(want)
    assert {k: seq[-1] for k, seq in got.items()} == {k: seq[-1] for k, seq in want.items()}
    for k, seq in before.items():
        assert seq == want[k][:len(seq)], k   # before the crash: a prefix of the driver's output
    expected = {k: before.get(k, []) + [(v, ts) for v, ts in want[k] if position[ts][1] >= committed[position[ts][0]]]
                for k in want}
    assert got == expected
    duplicates = sum(map(len, got.values())) - sum(map(len, want.values()))
    assert duplicates == len(uncommitted_out) > 0

    # 4. Sums per region through the repartition topic: exact, not double counted.
    sums = Counter()
    for _, v in records:
        d = json.loads(v)
        sums[d["region"]] += d["amount"]
    got_region = by_key(kafka.read_topic(kafka_bootstrap, by_region))
    want_region = driver_outputs_by_key(apps.crash_aggregates_topology, inp, [by_region], input_messages,
                                        per_partition=False)[by_region]
    final = {k: seq[-1][0] for k, seq in got_region.items()}
    assert final == {k: seq[-1][0] for k, seq in want_region.items()}
    assert {k.decode(): json.loads(v) for k, v in final.items()} == dict(sums)

    report(f"input {N} records on 4 partitions; SIGKILL at commit {KILL_AT_COMMIT} after {processed_before_crash} "
           f"records were processed, group offsets {[committed[p] for p in range(4)]} of "
           f"{[ends[p] for p in range(4)]} ({replayed} records after the committed offsets)")
    report(f"level on_change: {len(uncommitted_out)} emissions forwarded before the crash but not committed; "
           f"output {sum(map(len, got.values()))} records vs driver {sum(map(len, want.values()))} "
           f"-> {duplicates} duplicates from the replay, 0 lost")
    report(f"sum-by-region: {uncommitted_repartition} uncommitted repartition records before the crash, "
           f"{w.metrics()['task']['duplicates_dropped']} replayed ones dropped by provenance; "
           f"final sums exact; output {sum(map(len, got_region.values()))} records "
           f"vs driver {sum(map(len, want_region.values()))}")


def is_subsequence(small, big) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)
