"""The broker frozen for 20 s mid-run (issue 14, done-when): the workers resume on their own and
every output topic, read as a table, equals the broker-free driver's result.

A broker of its own (``own_broker``, of the run's kind: a process the test can SIGSTOP), two worker
processes running ``apps.convergence_topology`` (FK join, PK join on its result, aggregation fed
by the join) while 20,000 interleaved records arrive; 3 s into the input the broker process is
stopped (SIGSTOP) for 20 s, longer than the group's session timeout, then continued (SIGCONT).
The producer of the input rides it out too (its records wait in its queue)."""

import os
import signal
import threading
import time

import pytest

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    final_table,
    kill_leftover_workers,
    produce_interleaved,
    start_workers,
    stop_workers,
    wait_until_workers_assigned,
)
from tests.integration.test_outputs_converge import (
    _assert_outputs_equal,
    _convergence_topics,
    _driver_tables,
    _fail_if_one_exits,
    _scenario,
    _wait_until_drained,
    _wrong_keys,
)

N = 20_000
PARTS = 4
FREEZE_S = 20.0
SPEC = "tests.integration.apps:convergence_topology"
OUTS = ("enriched", "shipped", "carriers")


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_broker_frozen_for_20_s_workers_resume_outputs_exact(unique, tmp_path, monkeypatch, report, guarantee,
                                                            own_broker, broker_kind):
    broker = own_broker()
    bootstrap = broker.bootstrap_servers
    procs = []
    try:
        (orders, customers, shipments), app, outs, env = _convergence_topics(bootstrap, monkeypatch, unique,
                                                                             "freeze", "murmur2_random", PARTS)
        records = _scenario(orders, customers, shipments, N, seed=5)
        # on Tansu (docs/semantics.md "Isolation level") the workers read uncommitted under both guarantees
        conf = ["isolation.level=read_uncommitted"] if broker_kind == "tansu" else []
        _, logs, procs = start_workers(bootstrap, SPEC, app, tmp_path, env, guarantee, conf)

        def worker_logs():
            return "\n".join(f"--- w{i} (exit code {p.poll()}):\n" + open(lg).read()[-4000:]
                             for i, (p, lg) in enumerate(zip(procs, logs, strict=False)))

        wait_until_workers_assigned(procs, logs, worker_logs)
        producer = threading.Thread(target=lambda: produce_interleaved(bootstrap, records, chunk=500, pause_s=0.1))
        t0 = time.monotonic()
        producer.start()
        time.sleep(3.0)
        os.kill(broker.pid(), signal.SIGSTOP)
        frozen_at = time.monotonic() - t0
        time.sleep(FREEZE_S)
        os.kill(broker.pid(), signal.SIGCONT)
        assert all(p.poll() is None for p in procs), worker_logs()
        producer.join(180)
        assert not producer.is_alive()
        _wait_until_drained(bootstrap, app, [orders, customers, shipments], PARTS, "read_uncommitted",
                            _fail_if_one_exits(procs, worker_logs), worker_logs)
        drained_s = time.monotonic() - t0
        stop_workers(procs, logs)
        text = "".join(open(lg).read() for lg in logs)
        inputs = [m for t in (orders, customers, shipments) for m in kafka.read_topic(bootstrap, t)]
        assert len(inputs) == N
        want = _driver_tables(inputs, outs)
        # read_committed where the broker honours it: what a downstream exactly-once reader sees
        isolation = "read_uncommitted" if broker_kind == "tansu" else "read_committed"
        got = {j: final_table(kafka.read_topic(bootstrap, t, isolation_level=isolation))
               for j, t in outs.items()}
        wrong = _wrong_keys(got, want)
        report(f"{guarantee}: broker stopped at {frozen_at:.1f} s for {FREEZE_S:.0f} s; "
               f"drained after {drained_s:.1f} s; "
               f"{text.count('assigned ')} assignment(s), {text.count('Kafka error')} Kafka error warning(s), "
               f"{text.count('transaction aborted')} aborted transaction(s); final rows "
               f"{ {j: len(want[j]) for j in OUTS} }; "
               f"keys differing from the driver {({j: len(w) for j, w in wrong.items()})}")
        _assert_outputs_equal(want, wrong)
    finally:
        kill_leftover_workers(procs)
        try:
            os.kill(broker.pid(), signal.SIGCONT)
        except Exception:
            pass
        broker.stop()
