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
import signal
from collections import Counter

from processor import provenance
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    by_key,
    committed_offsets,
    driver_outputs_by_key,
    produce_paced,
    skewed_events,
    start_worker_process,
    wait_for,
)

N = 40_000
CHUNK = 500
COMMIT_INTERVAL_MS = 500
KILL_AT_COMMIT = 3


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
    # Record i at timestamp 1_000_000 + i, arriving steadily (a chunk every ~50 ms) from the
    # worker's assignment on, so every commit interval of the worker holds new input records and
    # the crash falls mid-stream; once the worker is dead, the rest arrives at once.
    log = tmp_path / "worker.log"
    proc = start_worker_process(kafka_bootstrap, "tests.integration.apps:crash_aggregates_topology", app,
                                tmp_path / "state", log,
                                {**env, "PROCESSOR_TEST_KILL_BEFORE_COMMIT": str(KILL_AT_COMMIT)},
                                commit_interval_ms=COMMIT_INTERVAL_MS)
    try:
        wait_for(lambda: "processor.worker: assigned" in open(log).read() or proc.poll() is not None,
                 60, "the worker's assignment")
        ends = produce_paced(kafka_bootstrap, inp, records, chunk=CHUNK, pause_s=0.05,
                             hurry=lambda: proc.poll() is not None)
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
               commit_interval_ms=COMMIT_INTERVAL_MS, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert committed_offsets(kafka_bootstrap, app, inp, 4) == {p: ends[p] for p in range(4)}
    replayed = N - sum(committed.values())
    # Every replayed repartition record whose original was on the broker is dropped, no other.
    assert w.metrics()["task"]["duplicates_dropped"] == uncommitted_repartition

    # 3. Read back, and the driver's answer: the level per user per input partition (exact
    # sequences), the sums per region over all of the input (final values only).
    got = by_key(kafka.read_topic(kafka_bootstrap, level))
    want = driver_outputs_by_key(apps.crash_aggregates_topology, inp, [level], input_messages)[level]
    got_region = by_key(kafka.read_topic(kafka_bootstrap, by_region))
    want_region = driver_outputs_by_key(apps.crash_aggregates_topology, inp, [by_region], input_messages,
                                        per_partition=False)[by_region]
    lost = [k for k in want if not is_subsequence(want[k], got.get(k, []))]
    duplicates = sum(map(len, got.values())) - sum(map(len, want.values()))
    report(f"input {N} records on 4 partitions; SIGKILL at commit {KILL_AT_COMMIT} after {processed_before_crash} "
           f"records were processed, group offsets {[committed[p] for p in range(4)]} of "
           f"{[ends[p] for p in range(4)]} ({replayed} records from the committed offsets on)")
    report(f"level (on_change): {len(uncommitted_out)} emissions forwarded before the crash but not committed; "
           f"output {sum(map(len, got.values()))} records vs driver {sum(map(len, want.values()))} "
           f"-> {duplicates} duplicates from the replay; keys with a lost emission: {len(lost)}")
    report(f"sum-by-region: {uncommitted_repartition} uncommitted repartition records before the crash, "
           f"{w.metrics()['task']['duplicates_dropped']} replayed ones dropped by provenance; "
           f"output {sum(map(len, got_region.values()))} records vs driver {sum(map(len, want_region.values()))}")

    # 4. On change: nothing lost. Per key, exactly what went out before the crash (a prefix of the
    # driver's output), then the driver's output for every record from the committed offset on.
    assert sum(map(len, want.values())) > N // 2
    assert lost == []
    assert set(got) == set(want)
    assert {k: seq[-1] for k, seq in got.items()} == {k: seq[-1] for k, seq in want.items()}
    for k, seq in before.items():
        assert seq == want[k][:len(seq)], k
    expected = {k: before.get(k, []) + [(v, ts) for v, ts in want[k] if position[ts][1] >= committed[position[ts][0]]]
                for k in want}
    assert got == expected
    assert duplicates == len(uncommitted_out) > 0

    # 5. Sums per region through the repartition topic: exact, not double counted.
    sums = Counter()
    for _, v in records:
        d = json.loads(v)
        sums[d["region"]] += d["amount"]
    final = {k: seq[-1][0] for k, seq in got_region.items()}
    assert final == {k: seq[-1][0] for k, seq in want_region.items()}
    assert {k.decode(): json.loads(v) for k, v in final.items()} == dict(sums)


def is_subsequence(small, big) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)
