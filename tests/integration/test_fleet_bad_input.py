"""Bad input to a fleet worker, on the broker (issue 36, docs/fleet.md "Bad input"): one clear
line each, the worker runs on with what it can do, nothing lost.

- ``num_standby_replicas`` larger than the other workers, and an ``--application-server`` where
  nothing listens: one warning line each, and the worker's outputs are exact.
- Task directories another application wrote (a copied state directory): moved aside, one line
  each, and the worker's outputs are exact. Opened as they were, they would hand the worker the
  other application's input positions (it would skip every record before them) and rows.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections import Counter

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.runtime.local_broker import free_port
from processor.runtime.worker import Worker
from processor.serde import Serdes
from processor.state import task_owner
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration.helpers import final_table, produce_with_partitioner

PARTS = 4


def counts_topology(inp: str, out: str):
    b = StreamsBuilder()
    b.stream(inp, key_serde=Serdes.string(), value_serde=Serdes.json(), partitioner="murmur2") \
        .group_by_key().count(name="counts").to_stream().to(out)
    return b.build()


def events(topic: str, n: int) -> tuple[list, dict[str, int]]:
    records = [(topic, f"k{i % 50}".encode(), json.dumps({"i": i}).encode()) for i in range(n)]
    return records, dict(Counter(f"k{i % 50}" for i in range(n)))


# (the broker's first metadata answer took over the default 10 s once, late in a loaded run)
STARTUP_S = 60.0


def drain(worker: Worker) -> None:
    failed: list[BaseException] = []

    def run():
        try:
            worker.run(until_drained=True, install_signal_handlers=False)
        except BaseException as exc:   # re-raised in the test's thread
            failed.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(180)
    assert not t.is_alive(), "the worker did not drain in 180 s"
    if failed:
        raise failed[0]


def counts_in(bootstrap: str, topic: str) -> dict[str, int]:
    return {k.decode(): json.loads(v) for k, v in final_table(kafka.read_topic(bootstrap, topic)).items()}


def test_more_standbys_than_workers_and_an_unreachable_application_server(kafka_bootstrap, unique, tmp_path,
                                                                          caplog, report):
    inp, out, app = f"events-{unique}", f"counts-{unique}", f"badinput-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out: PARTS})
    records, want = events(inp, 3000)
    produce_with_partitioner(kafka_bootstrap, records, "murmur2_random")
    caplog.set_level(logging.INFO)
    nobody = f"127.0.0.1:{free_port()}"   # nothing listens there
    w = Worker(counts_topology(inp, out), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG, startup_timeout_s=STARTUP_S, num_standby_replicas=2,
               http_port=0, http_host="127.0.0.1", application_server=nobody)
    drain(w)
    assert w.records_processed == 3000
    assert counts_in(kafka_bootstrap, out) == want
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    standby = [m for m in warnings if m.startswith("num_standby_replicas=")]
    assert standby == ["num_standby_replicas=2, but the group has 1 member(s): each task keeps 0 standby copies "
                       "until more workers join"], warnings
    server = [m for m in warnings if m.startswith("application server ")]
    assert len(server) == 1, warnings
    assert server[0].startswith(f"application server {nobody} does not reach this worker's HTTP endpoint (port ")
    assert "ConnectionRefusedError" in server[0] and server[0].endswith("processing is unaffected")
    report(f"one worker, num_standby_replicas=2, application server {nobody} unreachable: 3000 records, "
           f"{len(want)} counts exact; one warning line each")


def test_task_directories_of_another_application_are_moved_aside(kafka_bootstrap, unique, tmp_path, caplog,
                                                                  report):
    """Application ``other`` counts the first 2000 events; its task directories are then copied
    under application ``app``'s (same topology, same input, its own output), which must count
    every event, the 2000 the other application's positions would have skipped included."""
    inp, out_other, out, other, app = (f"events-{unique}", f"counts-other-{unique}", f"counts-{unique}",
                                       f"other-{unique}", f"app-{unique}")
    kafka.create_topics(kafka_bootstrap, {inp: PARTS, out_other: PARTS, out: PARTS})
    first, _ = events(inp, 2000)
    produce_with_partitioner(kafka_bootstrap, first, "murmur2_random")
    drain(Worker(counts_topology(inp, out_other), kafka_bootstrap, other, tmp_path, commit_interval_ms=200,
                 consumer_config=TEST_CONSUMER_CONFIG, startup_timeout_s=STARTUP_S))
    copied = sorted((tmp_path / other).glob("task-*"))
    assert len(copied) == PARTS
    for d in copied:
        assert task_owner.read_marker(d).application_id == other
        shutil.copytree(d, tmp_path / app / d.name)
    records, want = events(inp, 3000)
    produce_with_partitioner(kafka_bootstrap, records[2000:], "murmur2_random")
    caplog.set_level(logging.INFO)
    w = Worker(counts_topology(inp, out), kafka_bootstrap, app, tmp_path, commit_interval_ms=200,
               consumer_config=TEST_CONSUMER_CONFIG, startup_timeout_s=STARTUP_S)
    drain(w)
    assert w.records_processed == 3000
    assert counts_in(kafka_bootstrap, out) == want
    moved = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "moved aside" in r.getMessage()]
    assert len(moved) == PARTS, moved
    for d in copied:
        assert sum(f"task directory {tmp_path / app / d.name} was written by application {other!r}" in m
                   for m in moved) == 1, moved
        assert task_owner.read_marker(tmp_path / app / d.name).application_id == app
    assert len(list((tmp_path / app / "moved-aside").iterdir())) == PARTS
    report(f"{PARTS} task directories of application {other} under {app}: moved aside, one line each; "
           f"3000 records, {len(want)} counts exact")
