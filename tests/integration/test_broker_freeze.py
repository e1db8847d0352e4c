"""The broker frozen for 20 s mid-run (issue 14, done-when): the workers resume on their own and
every output topic, read as a table, equals the broker-free driver's result.

A broker of its own (Tansu, started for this test: a process the test can SIGSTOP), two worker
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
from processor.runtime.local_broker import LocalBroker
from processor.serde import Serdes
from processor.testing import TopologyTestDriver
from tests.integration import apps
from tests.integration.helpers import (
    final_table,
    final_table_values,
    produce_interleaved,
    start_worker_process,
    wait_until_tasks_committed,
)
from tests.integration.test_outputs_converge import _scenario

N = 20_000
PARTS = 4
FREEZE_S = 20.0
SPEC = "tests.integration.apps:convergence_topology"
OUTS = ("enriched", "shipped", "carriers")


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_broker_frozen_for_20_s_workers_resume_outputs_exact(unique, tmp_path, monkeypatch, report, guarantee):
    broker = LocalBroker(log_path=tmp_path / "tansu.log").start()
    bootstrap = broker.bootstrap_servers
    procs = []
    try:
        orders, customers, shipments = f"orders-{unique}", f"customers-{unique}", f"shipments-{unique}"
        prefix = app = f"freeze-{unique}"
        outs = {j: f"{prefix}-{j}" for j in OUTS}
        env = {"APP_ORDERS": orders, "APP_CUSTOMERS": customers, "APP_SHIPMENTS": shipments,
               "APP_OUTPUT_PREFIX": prefix, "APP_PARTITIONER": "murmur2_random"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        kafka.create_topics(bootstrap, {orders: PARTS, customers: PARTS, shipments: PARTS,
                                        **{t: PARTS for t in outs.values()}})
        records = _scenario(orders, customers, shipments, N, seed=5)
        # on Tansu (docs/semantics.md "Isolation level") the workers read uncommitted under both guarantees
        conf = ["isolation.level=read_uncommitted"]
        logs = [tmp_path / f"w{i}.log" for i in range(2)]
        procs = [start_worker_process(bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                      consumer_config=conf) for i in range(2)]

        def worker_logs():
            return "\n".join(f"--- w{i} (exit code {p.poll()}):\n" + open(lg).read()[-4000:]
                             for i, (p, lg) in enumerate(zip(procs, logs, strict=False)))

        deadline = time.monotonic() + 60
        while not all("processor.worker: assigned" in open(lg).read() for lg in logs):
            assert all(p.poll() is None for p in procs), worker_logs()
            assert time.monotonic() < deadline, "workers not assigned within 60 s"
            time.sleep(0.2)
        producer = threading.Thread(target=lambda: produce_interleaved(bootstrap, records, chunk=500, pause_s=0.1))
        t0 = time.monotonic()
        producer.start()
        time.sleep(3.0)
        os.kill(broker._proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic() - t0
        time.sleep(FREEZE_S)
        os.kill(broker._proc.pid, signal.SIGCONT)
        assert all(p.poll() is None for p in procs), worker_logs()
        producer.join(180)
        assert not producer.is_alive()

        def alive():
            if any(p.poll() is not None for p in procs):
                pytest.fail(f"a worker exited on its own\n{worker_logs()}")

        topo = apps.convergence_topology().for_application(app)
        internal = [f"{app}-carriers-repartition", f"{app}-enriched-subscription-registration-topic",
                    f"{app}-enriched-subscription-response-topic"]
        try:
            wait_until_tasks_committed(bootstrap, topo, {t: PARTS for t in [orders, customers, shipments] + internal},
                                       "read_uncommitted", timeout_s=240, check=alive)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{worker_logs()}") from None
        drained_s = time.monotonic() - t0
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for i, p in enumerate(procs):
            assert p.wait(60) == 0, open(logs[i]).read()[-3000:]
        text = "".join(open(lg).read() for lg in logs)
        inputs = [m for t in (orders, customers, shipments) for m in kafka.read_topic(bootstrap, t)]
        assert len(inputs) == N
        with TopologyTestDriver(apps.convergence_topology()) as driver:
            for m in inputs:
                driver.pipe_raw(m.topic(), m.key(), m.value(), m.timestamp()[1])
            want = {j: final_table_values(driver.read_output(t, key_serde=Serdes.bytes(), value_serde=Serdes.bytes()))
                    for j, t in outs.items()}
        got = {j: final_table(kafka.read_topic(bootstrap, t, isolation_level="read_uncommitted"))
               for j, t in outs.items()}
        wrong = {j: sorted(k for k in set(got[j]) | set(want[j]) if got[j].get(k) != want[j].get(k)) for j in OUTS}
        report(f"{guarantee}: broker stopped at {frozen_at:.1f} s for {FREEZE_S:.0f} s; "
               f"drained after {drained_s:.1f} s; "
               f"{text.count('assigned ')} assignment(s), {text.count('Kafka error')} Kafka error warning(s), "
               f"{text.count('transaction aborted')} aborted transaction(s); final rows "
               f"{ {j: len(want[j]) for j in OUTS} }; "
               f"keys differing from the driver {({j: len(w) for j, w in wrong.items()})}")
        for j in OUTS:
            assert want[j], j
            assert not wrong[j], (j, len(wrong[j]), wrong[j][:5])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        try:
            os.kill(broker._proc.pid, signal.SIGCONT)
        except Exception:
            pass
        broker.stop()
