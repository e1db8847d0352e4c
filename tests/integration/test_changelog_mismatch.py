"""Operational error "a changelog that does not match the local checkpoint" (exit code 5).

A worker process runs on the session broker until it has processed and committed its input, and
is stopped with SIGTERM: its state directory now says its stores reflect the task changelog and
the store changelog up to some offsets. Then a SECOND, fresh broker (``own_broker``, of the run's
kind) gets the same input and output topics and the worker is started again with the same ``--state-dir`` and
``--application-id`` against it: the changelog topics there are new and empty, so the local
checkpoint is past their end. The worker must refuse to run on that state: exit code 5, ONE line
on stderr (``processor: error: ...``) naming the changelog topic and partition and the offset
the local state claims, no traceback, nothing produced to the output topic."""

import json
import re
import signal
import time

from processor.kafka import clients as kafka
from processor.state.rocksdb import RocksDBDatabase
from processor.state.store import TASK_STORE
from tests.integration.helpers import produce, start_worker_process, wait_until_group_drained
from tests.integration.test_operational_errors import FAST_GROUP, assert_exit, run_args, run_worker

N = 200
SPEC = "tests.integration.apps:filter_topology"


def test_changelog_behind_local_checkpoint_exits_5(kafka_bootstrap, unique, tmp_path, report, own_broker):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    state = tmp_path / "state"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    records = [(f"o{i % 50}".encode(), json.dumps({"amount": (i * 37) % 200}).encode()) for i in range(N)]
    assert produce(kafka_bootstrap, inp, records) == {0: N}

    # 1. a normal run on the session broker, stopped cleanly once everything is committed
    log = tmp_path / "first.log"
    first = start_worker_process(kafka_bootstrap, SPEC, app, state, log, env)
    try:
        t0 = time.monotonic()
        wait_until_group_drained(kafka_bootstrap, app, {inp: 1}, timeout_s=60)
        first_s = time.monotonic() - t0
        assert first.poll() is None, log.read_text()[-3000:]
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert "processor: error" not in log.read_text()
    assert f"stopped after {N} records" in log.read_text()

    task_topic = f"{app}-{TASK_STORE}-0-changelog"
    bookkeeping_topic = f"{app}-_bookkeeping-0-changelog"   # empty here: a table filter keeps no marks
    store_changelogs = sorted(t for t in kafka.topic_partitions(kafka_bootstrap)
                              if t.startswith(f"{app}-") and t.endswith("-changelog")
                              and t not in (task_topic, bookkeeping_topic))
    assert len(store_changelogs) == 1, store_changelogs   # the table's store
    db = RocksDBDatabase(state / app / "task-0_0")
    try:
        checkpoint = db.read_checkpoint()
    finally:
        db.close()
    assert checkpoint[(inp, 0)] == N
    task_offset = checkpoint[(task_topic, 0)]
    store_offset = checkpoint[(store_changelogs[0], 0)]
    assert task_offset > 0 and store_offset > 0, checkpoint

    # 2. the same application and state directory against a fresh broker: same input and output
    # topics (with the same records), changelog topics created anew, empty
    other = own_broker()
    kafka.create_topics(other.bootstrap_servers, {inp: 1, out: 1})
    produce(other.bootstrap_servers, inp, records)
    t0 = time.monotonic()
    p = run_worker(run_args("filter_topology", other.bootstrap_servers, app, state, *FAST_GROUP), env,
                   timeout=150)
    refused_s = time.monotonic() - t0
    # (a refusal, not a restore that waits for records that will never come)
    last = assert_exit(p, 5, "task 0_0", f"changelog {task_topic}[0]", "delete")
    assert re.search(rf"\boffset {task_offset}\b", last), last   # what the local state claims
    # nothing was processed on the mismatched state
    assert kafka.read_topic(other.bootstrap_servers, out) == []
    assert refused_s < 30, refused_s
    assert "stopped after" not in p.stderr

    # the state directory is left as it was (the worker refused, it did not "repair" anything)
    db = RocksDBDatabase(state / app / "task-0_0")
    try:
        assert db.read_checkpoint() == checkpoint
    finally:
        db.close()
    report(f"first run: {N} records committed in {first_s:.1f} s; local checkpoint {task_topic}[0]@{task_offset}, "
           f"{store_changelogs[0]}[0]@{store_offset}; against a fresh broker: exit 5 after {refused_s:.1f} s")
    report(f"error line: {last}")
