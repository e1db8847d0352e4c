"""The broker frozen for 20 s mid-run (issue 14, done-when): the workers resume on their own and
every output topic, read as a table, equals the broker-free driver's result.

A broker of its own (``own_broker``, of the run's kind: a process the test can SIGSTOP), two worker
processes running ``apps.convergence_topology`` (FK join, PK join on its result, aggregation fed
by the join) while 20,000 interleaved records arrive; 3 s into the input the broker process is
stopped (SIGSTOP) for 20 s, longer than the group's session timeout, then continued (SIGCONT).
The producer of the input rides it out too (its records wait in its queue).

``exactly_once-txn_timeout_10s``: the workers' producers set ``transaction.timeout.ms=10000``
(Kafka Streams' value, the worker's default too since 02db06c: this case pins it), shorter than
the pause: the open transaction outlives its timeout (its
records time out in librdkafka, capped at the transaction timeout, and the broker aborts it once
it runs again); the workers abort, rebuild their tasks from their changelogs and go on.

Each run reports how long after the thaw the first output record could be read (at the
isolation level a downstream reader uses) by a reader kept at the outputs' end."""

import os
import signal
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from processor.kafka import clients as kafka
from tests.integration.helpers import (
    final_table,
    kill_leftover_workers,
    start_worker_process,
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


def _produce_riding_out(bootstrap: str, records, chunk: int, pause_s: float) -> None:
    """``produce_interleaved``'s input (record ``i`` at timestamp 1,000,000 + ``i``, in chunks of
    ``chunk`` flushed and followed by ``pause_s``), each flush waiting as long as the pause and
    the broker's recovery take: Apache Kafka answers requests sent while it was stopped only
    after they time out (30 s), and a chunk flushed then must still arrive whole."""
    errors = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)

    p = Producer(kafka.producer_defaults(bootstrap))
    for i, (topic, k, v) in enumerate(records):
        while True:
            try:
                p.produce(topic, v, k, timestamp=1_000_000 + i, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        if (i + 1) % chunk == 0 or i + 1 == len(records):
            assert p.flush(180) == 0
            assert not errors, errors
            time.sleep(pause_s)


class _OutputWatcher:
    """A reader of the output topics from their beginning, on a thread, noting when each record
    arrived (``time.monotonic``): the first arrival after the thaw is when outputs resumed."""

    def __init__(self, bootstrap: str, topics: list[str], isolation: str) -> None:
        parts = kafka.topic_partitions(bootstrap)
        conf = kafka.consumer_defaults(bootstrap)
        conf.update({"group.id": f"freeze-watch-{time.time_ns()}", "isolation.level": isolation,
                     "fetch.wait.max.ms": 50, "enable.partition.eof": False})
        self.consumer = kafka.new_consumer(conf, "watching the outputs")
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(parts[t])])
        self.arrivals: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.consumer.consume(1000, 0.1):
                if m.error() is None:
                    self.arrivals.append(time.monotonic())

    def first_after(self, t: float) -> float | None:
        return next((a - t for a in self.arrivals if a > t), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


@pytest.mark.parametrize("guarantee, producer_conf", [
    pytest.param("at_least_once", [], id="at_least_once"),
    pytest.param("exactly_once", [], id="exactly_once"),
    pytest.param("exactly_once", ["transaction.timeout.ms=10000"], id="exactly_once-txn_timeout_10s"),
])
def test_broker_frozen_for_20_s_workers_resume_outputs_exact(unique, tmp_path, monkeypatch, report, guarantee,
                                                            producer_conf, own_broker, broker_kind):
    broker = own_broker()
    bootstrap = broker.bootstrap_servers
    procs = []
    watcher = None
    try:
        (orders, customers, shipments), app, outs, env = _convergence_topics(bootstrap, monkeypatch, unique,
                                                                             "freeze", "murmur2_random", PARTS)
        records = _scenario(orders, customers, shipments, N, seed=5)
        # on Tansu (docs/semantics.md "Isolation level") the workers read uncommitted under both guarantees
        conf = ["isolation.level=read_uncommitted"] if broker_kind == "tansu" else []
        extra = [a for kv in producer_conf for a in ("--producer-config", kv)]
        logs = [tmp_path / f"w{i}.log" for i in range(2)]
        procs = [start_worker_process(bootstrap, SPEC, app, tmp_path / f"w{i}", logs[i], env, guarantee,
                                      consumer_config=conf, extra_args=extra) for i in range(2)]

        def worker_logs():
            return "\n".join(f"--- w{i} (exit code {p.poll()}):\n" + open(lg).read()[-4000:]
                             for i, (p, lg) in enumerate(zip(procs, logs, strict=False)))

        wait_until_workers_assigned(procs, logs, worker_logs)
        # read_committed where the broker honours it: what a downstream exactly-once reader sees
        isolation = "read_uncommitted" if broker_kind == "tansu" else "read_committed"
        watcher = _OutputWatcher(bootstrap, list(outs.values()), isolation)
        produce_failed: list[BaseException] = []

        def produce() -> None:
            try:
                _produce_riding_out(bootstrap, records, chunk=500, pause_s=0.1)
            except BaseException as exc:
                produce_failed.append(exc)
        producer = threading.Thread(target=produce)
        t0 = time.monotonic()
        producer.start()
        time.sleep(3.0)
        os.kill(broker.pid(), signal.SIGSTOP)
        frozen_at = time.monotonic() - t0
        time.sleep(FREEZE_S)
        os.kill(broker.pid(), signal.SIGCONT)
        thawed = time.monotonic()
        assert all(p.poll() is None for p in procs), worker_logs()
        producer.join(180)
        assert not producer.is_alive()
        assert not produce_failed, f"the input's producer failed: {produce_failed[0]!r}"
        _wait_until_drained(bootstrap, app, [orders, customers, shipments], PARTS, "read_uncommitted",
                            _fail_if_one_exits(procs, worker_logs), worker_logs)
        drained_s = time.monotonic() - t0
        resumed = watcher.first_after(thawed)
        stop_workers(procs, logs)
        text = "".join(open(lg).read() for lg in logs)
        inputs = [m for t in (orders, customers, shipments) for m in kafka.read_topic(bootstrap, t)]
        assert len(inputs) == N
        want = _driver_tables(inputs, outs)
        got = {j: final_table(kafka.read_topic(bootstrap, t, isolation_level=isolation))
               for j, t in outs.items()}
        wrong = _wrong_keys(got, want)
        report(f"{guarantee}{' ' + ' '.join(producer_conf) if producer_conf else ''}: broker stopped at "
               f"{frozen_at:.1f} s for {FREEZE_S:.0f} s; first output ({isolation}) "
               f"{'none' if resumed is None else f'{resumed:.1f} s'} after the thaw; "
               f"drained after {drained_s:.1f} s; "
               f"{text.count('assigned ')} assignment(s), {text.count('Kafka error')} Kafka error warning(s), "
               f"{text.count('transient, ')} transient error(s) retried, "
               f"{text.count('transaction aborted')} aborted transaction(s), "
               f"{text.count('new transactional producer')} new transactional producer(s); final rows "
               f"{ {j: len(want[j]) for j in OUTS} }; "
               f"keys differing from the driver {({j: len(w) for j, w in wrong.items()})}")
        _assert_outputs_equal(want, wrong)
    finally:
        if watcher is not None:
            watcher.close()
        kill_leftover_workers(procs)
        try:
            os.kill(broker.pid(), signal.SIGCONT)
        except Exception:
            pass
        broker.stop()
