"""``max_task_idle_ms`` (KIP-695's meaning) on a real broker: a stream-table join whose table
topic is empty when the worker starts; the clicks are there. The user rows (older than the
clicks) arrive while the worker runs.

- ``max_task_idle_ms=8000``: the task waits for the empty partition (it is at its end: it
  may get data), the rows arrive within the wait, and every click joins its row. Once the rows
  are processed the partition is at its end again: the task waits 8 s more for it, then
  processes the clicks (``enforced_processing`` counts each), as Kafka Streams does.
- ``max_task_idle_ms=0`` (the default): the partition at its end is not waited for; the clicks
  are processed at once, none finds its row, and the rows then come with the clicks' partition
  empty (``enforced_processing`` counts all of them), as Kafka Streams does."""

import json
import threading
import time

import pytest

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import produce, wait_until_group_drained

CLICKS = 40


def topology_for(t):
    b = StreamsBuilder()
    users = b.table(t["users"], store_name="users")
    b.stream(t["clicks"]).join(users, lambda c, u: {"c": c["n"], "r": u["r"]}).to(t["out"])
    return b.build()


@pytest.mark.parametrize("idle_ms", [8_000, 0])
def test_max_task_idle_ms_waits_for_a_partition_at_its_end(kafka_bootstrap, unique, tmp_path, idle_ms):
    t = {n: f"idle-{n}-{idle_ms}-{unique}" for n in ("users", "clicks", "out")}
    kafka.create_topics(kafka_bootstrap, {v: 1 for v in t.values()})
    produce(kafka_bootstrap, t["clicks"], [(f"u{i:02d}".encode(), json.dumps({"n": i}).encode())
                                          for i in range(CLICKS)], timestamp0=2_000_000)
    app = f"idle-{idle_ms}-{unique}"
    w = Worker(topology_for(t), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG, max_task_idle_ms=idle_ms)
    runner = threading.Thread(target=w.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        deadline = time.monotonic() + 60
        # idle: the task has its clicks and waits on the users partition, seen at its end;
        # 0: it processed the clicks
        def ready():
            if idle_ms:
                return (w.metrics().get("task", {}).get("idle_waits", 0) >= 1
                        and (t["users"], 0) in w.task_manager.at_eof)
            return w.records_processed >= CLICKS
        while not ready():
            assert time.monotonic() < deadline, "the worker never got its clicks"
            time.sleep(0.05)
        assert w.records_processed == (0 if idle_ms else CLICKS)
        produce(kafka_bootstrap, t["users"], [(f"u{i:02d}".encode(), json.dumps({"r": "A"}).encode())
                                             for i in range(CLICKS)], timestamp0=1_000_000)
        wait_until_group_drained(kafka_bootstrap, app, {t["users"]: 1, t["clicks"]: 1})
        counters = w.metrics()["task"]
    finally:
        w.stop()
        runner.join(60)
    out = kafka.read_topic(kafka_bootstrap, t["out"])
    if idle_ms:
        assert [(m.key(), json.loads(m.value())) for m in out] == [
            (f"u{i:02d}".encode(), {"c": i, "r": "A"}) for i in range(CLICKS)]
        assert counters["idle_waits"] >= 2   # before the rows, and after them
        assert counters["enforced_processing"] == CLICKS
    else:   # the clicks with the users partition empty, then the rows with the clicks' empty
        assert out == []
        assert counters["enforced_processing"] == 2 * CLICKS
