"""A scale-out under load does not stop the partitions that stay (issue 36, cooperative rebalancing).

Two worker processes count events over 6 partitions while events arrive on every partition
every 50 ms; a third worker joins. The partitions whose owner does not change keep producing
outputs through the rebalance: the longest time any of them goes without a new output, from the
third worker's start until the fleet has settled, stays under two commit intervals. The tasks
end balanced (2 per worker) and the final counts equal the events produced.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from processor.kafka import clients as kafka
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
KEYS = [f"k{i:04d}" for i in range(600)]
COMMIT_MS = 1000



@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_scale_out_does_not_pause_partitions_that_stay(kafka_bootstrap, unique, tmp_path, monkeypatch, report,
                                                       guarantee):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"scaleout-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    topo = apps.counts_topology().for_application(app)
    logs = [tmp_path / f"w{i}.log" for i in range(3)]

    def start(i):
        return start_worker_process(kafka_bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                    commit_interval_ms=COMMIT_MS,
                                    consumer_config=["isolation.level=read_uncommitted"])

    produced: list[tuple[str, bytes, bytes]] = []
    stop = threading.Event()

    def load():
        r = 0
        while not stop.is_set():
            batch = [(inp, k.encode(), json.dumps({"r": r}).encode()) for k in KEYS[r % 10::10]]
            produce_with_partitioner(kafka_bootstrap, batch, "murmur2_random")
            produced.extend(batch)
            r += 1
            time.sleep(0.05)

    ends: dict[int, list[tuple[float, int]]] = {p: [] for p in range(PARTS)}   # output high watermarks seen
    samples: list[float] = []   # when each round of the watch began (a gap is seen to within a round)

    def watch():
        c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"watch-{unique}"})
        try:
            while not stop.is_set():
                now = time.monotonic()
                samples.append(now)
                for p in range(PARTS):
                    _, high = c.get_watermark_offsets(TopicPartition(out, p), timeout=5, cached=False)
                    if not ends[p] or ends[p][-1][1] != high:
                        ends[p].append((now, high))
                time.sleep(0.05)
        finally:
            c.close()

    procs = [start(0), start(1)]
    threads = [threading.Thread(target=load, daemon=True), threading.Thread(target=watch, daemon=True)]
    try:
        wait_for(lambda: all(len(assigned_partitions_now(open(log).read())) == 3 for log in logs[:2]), 90,
                 "3 tasks on each of 2", list(zip(procs, logs, strict=False)))
        for t in threads:
            t.start()
        time.sleep(4)
        before = [assigned_partitions_now(open(log).read()) for log in logs[:2]]
        joined_at = time.monotonic()
        procs.append(start(2))
        wait_for(lambda: sorted(len(assigned_partitions_now(open(log).read())) for log in logs) == [2, 2, 2], 90,
                 "2 tasks on each of 3", list(zip(procs, logs, strict=True)))
        settled_at = time.monotonic()
        time.sleep(3)
        stop.set()
        for t in threads:
            t.join(30)
        after = [assigned_partitions_now(open(log).read()) for log in logs[:2]]
        stayed = sorted(set().union(*(b & a for b, a in zip(before, after, strict=True))))
        assert len(stayed) == 4, (before, after)    # 2 of the 6 tasks moved, the other 4 stayed
        window = [t for t in samples if joined_at - 1 <= t <= settled_at + 2]
        resolution = max(b - a for a, b in zip(window, window[1:], strict=False))
        gaps = {}
        for p in stayed:
            times = [t for t, _ in ends[p] if joined_at - 1 <= t <= settled_at + 2]
            gaps[p] = max(b - a for a, b in zip(times, times[1:], strict=False))
        wait_until_tasks_committed(kafka_bootstrap, topo, {inp: PARTS}, "read_uncommitted", timeout_s=120)
        want: dict[bytes, int] = {}
        for _, k, _ in produced:
            want[k] = want.get(k, 0) + 1
        got = {k: json.loads(v) for k, v in final_table(kafka.read_topic(kafka_bootstrap, out)).items()}
        assert got == want
        stop_workers(procs, logs)
    finally:
        stop.set()
        kill_leftover_workers(procs)
    report(f"{guarantee}: scale-out 2 -> 3 settled {settled_at - joined_at:.1f} s after the start; longest output "
           f"gap of the 4 partitions that stayed: {max(gaps.values()):.2f} s (per partition "
           f"{ {p: round(g, 2) for p, g in gaps.items()} }), commit interval {COMMIT_MS / 1000:.1f} s; "
           f"the watch sees a gap to within {resolution:.2f} s")
    # the bound: two commit intervals, as far as the watch's rounds can tell
    assert max(gaps.values()) < 2 * COMMIT_MS / 1000 + resolution, (gaps, resolution)
