"""Two worker processes in one group split the partitions and together produce the complete
output; SIGTERM one mid-run and the other takes over (restoring the table store from the source
topic) with nothing lost. Duplicates are allowed at this stage; losses are not."""

import re
import signal
import threading
import time

from processor.kafka import clients as kafka
from tests.integration import apps
from tests.integration.helpers import (
    by_key,
    committed_offsets,
    driver_output_by_key,
    produce,
    start_worker_process,
    table_updates,
    wait_for,
)


def assigned_partitions(log) -> list[int] | None:
    lines = [ln for ln in open(log) if "processor.worker: assigned" in ln]
    if not lines:
        return None
    return sorted(int(p) for p in re.findall(r"\[(\d+)\]@", lines[-1]))


def records_processed(log) -> int:
    m = re.search(r"stopped after (\d+) records", open(log).read())
    assert m, open(log).read()[-2000:]
    return int(m.group(1))


def is_subsequence(small, big) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def test_two_workers_split_partitions_and_survive_sigterm(kafka_bootstrap, unique, tmp_path, monkeypatch):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kafka.create_topics(kafka_bootstrap, {inp: 4, out: 4})
    records = table_updates(20_000, keys=2_000, seed=5)
    first, second = records[:8_000], records[8_000:]
    produce(kafka_bootstrap, inp, first, timestamp0=1_000_000)

    logs = {w: tmp_path / f"{w}.log" for w in "AB"}
    procs = {w: start_worker_process(kafka_bootstrap, "tests.integration.apps:filter_topology", app,
                                     tmp_path / f"state-{w}", logs[w], env, commit_interval_ms=200) for w in "AB"}
    try:
        wait_for(lambda: assigned_partitions(logs["A"]) is not None and assigned_partitions(logs["B"]) is not None
                 and len(assigned_partitions(logs["A"])) == 2 and len(assigned_partitions(logs["B"])) == 2,
                 60, "both workers to own two partitions each", poll_s=0.2)
        assert sorted(assigned_partitions(logs["A"]) + assigned_partitions(logs["B"])) == [0, 1, 2, 3]

        # Keep producing while A is stopped mid-run.
        producer = threading.Thread(target=lambda: produce_slowly(kafka_bootstrap, inp, second))
        producer.start()
        time.sleep(1.5)
        procs["A"].send_signal(signal.SIGTERM)
        assert procs["A"].wait(timeout=60) == 0, open(logs["A"]).read()[-3000:]
        producer.join()

        ends = {}
        for m in kafka.read_topic(kafka_bootstrap, inp):
            ends[m.partition()] = m.offset() + 1
        wait_for(lambda: committed_offsets(kafka_bootstrap, app, inp, 4) == ends, 90,
                 "worker B to commit the end of every partition", poll_s=0.2)
        assert assigned_partitions(logs["B"]) == [0, 1, 2, 3]
        procs["B"].send_signal(signal.SIGTERM)
        assert procs["B"].wait(timeout=60) == 0, open(logs["B"]).read()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    a_done, b_done = records_processed(logs["A"]), records_processed(logs["B"])
    assert a_done > 0 and b_done > 0
    assert a_done + b_done >= len(records)
    assert "restored task" in open(logs["B"]).read()   # B caught A's table stores up from the topic

    got = by_key(kafka.read_topic(kafka_bootstrap, out))
    want = driver_output_by_key(apps.filter_topology, inp, out, kafka.read_topic(kafka_bootstrap, inp))
    assert set(got) == set(want)
    lost = [k for k in want if not is_subsequence(want[k], got[k])]
    assert lost == []
    assert all(got[k][-1] == want[k][-1] for k in want)
    print(f"\nA processed {a_done}, B processed {b_done}; output {sum(map(len, got.values()))} records "
          f"vs driver {sum(map(len, want.values()))} (duplicates from replay allowed)")


def produce_slowly(bootstrap, topic, records, chunk=1_000, pause=0.3):
    for i in range(0, len(records), chunk):
        produce(bootstrap, topic, records[i:i + chunk], timestamp0=2_000_000 + i)
        time.sleep(pause)
