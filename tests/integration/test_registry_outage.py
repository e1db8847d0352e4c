"""Issue 47, item 2, on Apache Kafka 4.4: a Schema Registry outage is not a bad record.

``processor run`` (child processes) reads and writes Avro through a real HTTP registry
(``tests/support/schema_registry_server.py``, in this process) that goes down, refuses the
credentials (401) or answers 503. Each time the worker waits the outage out for
``outage.timeout.ms`` (3 s here), then stops with ONE line naming the registry and exit code 8;
nothing is dead-lettered and the group commits nothing past the record in hand. Restarted with
the registry back, it processes everything: the outputs are exactly the expected ones, the
dead-letter topic stays empty. A genuinely unknown schema id is still a bad record: dead-lettered
once, and not again across a restart."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.serde import SCHEMAS_DIR, Serdes
from processor.serde.registry import client_for
from tests.integration.helpers import committed_offsets, produce, start_worker_process, wait_for
from tests.support.schema_registry_server import SchemaRegistryServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORDER_V1 = json.loads((SCHEMAS_DIR / "order.avsc").read_text())
ORDER_V2 = {**ORDER_V1, "fields": ORDER_V1["fields"] + [{"name": "note", "type": "string", "default": ""}]}
NOWHERE = "http://127.0.0.1:9"   # the code's registry URL: the worker is given the real one
BOUND_MS = 3000
UNKNOWN_ID = b"\x00\x00\x00\x7f\xff" + b"\x04o9"   # schema id 32767: never registered


def avro_orders():
    """``$APP_INPUT`` (Avro, registry) -> amount > 100 -> ``$APP_OUTPUT`` (Avro, registry)."""
    b = StreamsBuilder()
    b.stream(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.avro("order", registry=NOWHERE)) \
        .filter(lambda k, v: v["amount"] > 100) \
        .to(os.environ["APP_OUTPUT"], value_serde=Serdes.avro("order", registry=NOWHERE))
    return b.build()


def json_to_avro():
    """``$APP_INPUT`` (JSON) -> ``$APP_OUTPUT`` (Avro, registry, auto-registered): the write side."""
    b = StreamsBuilder()
    b.stream(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .to(os.environ["APP_OUTPUT"], value_serde=Serdes.avro("order", registry=NOWHERE))
    return b.build()


def order(i, amount, **extra):
    return {"id": f"o{i}", "customer_id": f"c{i % 3}", "amount": amount, "status": "NEW", **extra}


def produce_avro(bootstrap, url, topic, schema, records):
    ser = AvroSerializer(client_for({"url": url}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        p.produce(topic, key=key.encode(), value=value if isinstance(value, bytes) else ser(value, ctx))
    assert p.flush(30) == 0


def outputs(bootstrap, url, topic):
    de = AvroDeserializer(client_for({"url": url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [(m.key().decode(), de(m.value(), ctx)) for m in kafka.read_topic(bootstrap, topic)]


def dead_letters(bootstrap, app):
    dlq = f"{app}-dlq"
    return kafka.read_topic(bootstrap, dlq) if dlq in kafka.topic_partitions(bootstrap) else []


def cli_args(url):
    return ["--schema-registry-url", url, "--schema-registry-config", f"outage.timeout.ms={BOUND_MS}"]


def run_into_the_outage(spec, bootstrap, app, state_dir, url, env) -> tuple[str, float]:
    """``processor run`` until it stops by itself: (its one error line, seconds from start to exit)."""
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "processor.cli", "run", spec, "--bootstrap-servers", bootstrap,
                        "--application-id", app, "--state-dir", str(state_dir),
                        "--consumer-config", "session.timeout.ms=6000",
                        "--consumer-config", "heartbeat.interval.ms=500", *cli_args(url)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=e)
    elapsed = time.monotonic() - t0
    assert p.returncode == 8, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("processor: error: ")]
    assert errors == [lines[-1]], p.stderr[-3000:]
    warned = [line for line in lines if "cannot be used (" in line]
    assert len(warned) == 1, p.stderr[-3000:]   # one warning for the kind, not one per retry
    waited = float(re.search(r"could not be used for ([0-9.]+) s", lines[-1]).group(1))
    assert BOUND_MS / 1000 <= waited < BOUND_MS / 1000 + 5.0, lines[-1]   # (one back-off step past it at most)
    return lines[-1], elapsed


def run_until(spec, bootstrap, app, state_dir, url, env, log, done, what):
    """``processor run`` until ``done()`` holds, then SIGTERM (a clean stop commits)."""
    p = start_worker_process(bootstrap, spec, app, state_dir, log, env,
                             extra_args=cli_args(url))
    try:
        wait_for(done, 90, what, procs=[(p, log)], poll_s=0.3)
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(60)
    assert rc == 0, open(log).read()[-3000:]


@pytest.fixture
def registry():
    with SchemaRegistryServer() as server:
        yield server


def test_a_registry_outage_stops_the_worker_and_loses_nothing_across_restarts(apache_kafka_bootstrap, registry,
                                                                              unique, tmp_path, report):
    bootstrap, url = apache_kafka_bootstrap, registry.url
    inp, out, app = f"ro-in-{unique}", f"ro-out-{unique}", f"ro-app-{unique}"
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    spec = "tests.integration.test_registry_outage:avro_orders"
    log = tmp_path / "worker.log"
    produce_avro(bootstrap, url, inp, ORDER_V1, [("o1", order(1, 150)), ("o2", order(2, 50))])

    # 1. the registry is down from the start: the first record waits, then the worker stops
    registry.down()
    line, took_down = run_into_the_outage(spec, bootstrap, app, tmp_path / "s", url, env)
    assert line.startswith(f"processor: error: the Schema Registry at {url} could not be used for ")
    assert (f"(outage.timeout.ms={BOUND_MS}, " in line and f"reading writer schema id 1 of a record of topic "
            f"{inp!r} (value): unreachable, ConnectError: " in line
            and line.endswith("; stopping without committing the record (it is read again after a restart)")), line
    assert dead_letters(bootstrap, app) == [] and outputs(bootstrap, url, out) == []
    assert committed_offsets(bootstrap, app, inp, 1)[0] <= 0   # (0: the initial commit)

    # 2. back up: both records processed, committed
    registry.up()
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, log,
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 2, "offset 2 committed")
    assert outputs(bootstrap, url, out) == [("o1", order(1, 150))]

    # 3. a producer moves to v2 (a schema id no worker has seen) while the registry refuses the
    # credentials: the worker stops at it; nothing past offset 2 is committed
    produce_avro(bootstrap, url, inp, ORDER_V2, [("o3", order(3, 300, note="gift")), ("o4", order(4, 20, note=""))])
    produce_avro(bootstrap, url, inp, ORDER_V1, [("o5", order(5, 500))])
    registry.fail_with(401)
    line, took_401 = run_into_the_outage(spec, bootstrap, app, tmp_path / "s", url, env)
    assert "reading writer schema id 2 of a record of topic" in line and \
        "(value): unauthorized, HTTP 401: Unauthorized; stopping" in line, line
    assert dead_letters(bootstrap, app) == []
    assert committed_offsets(bootstrap, app, inp, 1)[0] == 2

    # 4. and once more, the registry answering 503
    registry.fail_with(503)
    line, took_503 = run_into_the_outage(spec, bootstrap, app, tmp_path / "s", url, env)
    assert "(value): unavailable, HTTP 503: Service Unavailable; stopping" in line, line
    assert committed_offsets(bootstrap, app, inp, 1)[0] == 2

    # 5. back: everything after offset 2 processed once, nothing dead-lettered
    registry.fail_with(None)
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, log,
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 5, "offset 5 committed")
    assert outputs(bootstrap, url, out) == [("o1", order(1, 150)), ("o3", order(3, 300)), ("o5", order(5, 500))]
    assert dead_letters(bootstrap, app) == []
    report(f"registry outage (down, 401, 503; bound {BOUND_MS} ms): 5 records in, 3 out, 0 dead-lettered; "
           f"the stops took {took_down:.1f} s, {took_401:.1f} s, {took_503:.1f} s from process start to exit 8")


def test_an_unknown_schema_id_is_dead_lettered_once_across_an_outage_and_a_restart(apache_kafka_bootstrap, registry,
                                                                                   unique, tmp_path, report):
    bootstrap, url = apache_kafka_bootstrap, registry.url
    inp, out, app = f"ru-in-{unique}", f"ru-out-{unique}", f"ru-app-{unique}"
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    spec = "tests.integration.test_registry_outage:avro_orders"
    log = tmp_path / "worker.log"
    produce_avro(bootstrap, url, inp, ORDER_V1, [("o1", order(1, 150)), ("o2", UNKNOWN_ID), ("o3", order(3, 300))])

    registry.down()   # an outage first: not even the unknown id is dead-lettered for it
    run_into_the_outage(spec, bootstrap, app, tmp_path / "s", url, env)
    assert dead_letters(bootstrap, app) == [] and committed_offsets(bootstrap, app, inp, 1)[0] <= 0

    registry.up()
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, log,
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 3, "offset 3 committed")
    produce_avro(bootstrap, url, inp, ORDER_V1, [("o4", order(4, 400))])
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, log,   # a restart
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 4, "offset 4 committed")

    assert outputs(bootstrap, url, out) == [("o1", order(1, 150)), ("o3", order(3, 300)), ("o4", order(4, 400))]
    dlq = dead_letters(bootstrap, app)
    assert [(m.key(), m.value()) for m in dlq] == [(b"o2", UNKNOWN_ID)]
    message = dict(dlq[0].headers())["__streams.errors.message"].decode()
    assert message.endswith(f"writer schema id 32767 not found in the registry at {url}: Schema not found"), message
    report("unknown schema id across an outage and a restart: 4 records in, 3 out, 1 dead-lettered (once)")


def test_an_outage_while_registering_an_output_schema_is_no_output_error(apache_kafka_bootstrap, registry, unique,
                                                                        tmp_path, report):
    bootstrap, url = apache_kafka_bootstrap, registry.url
    inp, out, app = f"rw-in-{unique}", f"rw-out-{unique}", f"rw-app-{unique}"
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    spec = "tests.integration.test_registry_outage:json_to_avro"
    produce(bootstrap, inp, [(f"o{i}".encode(), json.dumps(order(i, 100 * i)).encode()) for i in (1, 2, 3)])

    registry.fail_with(401)
    line, took = run_into_the_outage(spec, bootstrap, app, tmp_path / "s", url, env)
    assert (f"registering schema processor.example.Order under subject '{out}-value': unauthorized, "
            f"HTTP 401: Unauthorized; stopping") in line, line
    assert dead_letters(bootstrap, app) == [] and kafka.read_topic(bootstrap, out) == []
    assert committed_offsets(bootstrap, app, inp, 1)[0] <= 0   # (0: the initial commit)

    registry.fail_with(None)
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, tmp_path / "worker.log",
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 3, "offset 3 committed")
    assert outputs(bootstrap, url, out) == [(f"o{i}", order(i, 100 * i)) for i in (1, 2, 3)]
    assert dead_letters(bootstrap, app) == []
    report(f"registry 401 while registering the output schema: 3 records in, 3 out, 0 dead-lettered; "
           f"the stop took {took:.1f} s")


def test_an_outage_stop_commits_what_came_before_the_record_so_nothing_is_dead_lettered_twice(
        apache_kafka_bootstrap, registry, unique, tmp_path, report):
    """A worker that has processed (and dead-lettered) records since its last commit, then meets an
    outage: before it stops it commits up to the record in hand (which left nothing behind), so a
    restart neither dead-letters nor outputs anything twice. A long commit interval makes sure no
    ordinary commit falls in between."""
    bootstrap, url = apache_kafka_bootstrap, registry.url
    inp, out, app = f"rc-in-{unique}", f"rc-out-{unique}", f"rc-app-{unique}"
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    env = {"APP_INPUT": inp, "APP_OUTPUT": out}
    spec = "tests.integration.test_registry_outage:avro_orders"
    log = tmp_path / "worker.log"
    produce_avro(bootstrap, url, inp, ORDER_V1, [("o1", order(1, 150)), ("o2", UNKNOWN_ID)])
    # o3 written with v2 now (registered while the registry answers), produced later
    o3 = AvroSerializer(client_for({"url": url}), json.dumps(ORDER_V2))(
        order(3, 300, note="gift"), SerializationContext(inp, MessageField.VALUE))
    p = start_worker_process(bootstrap, spec, app, tmp_path / "s", log, env, commit_interval_ms=600_000,
                             extra_args=cli_args(url))
    try:
        wait_for(lambda: len(dead_letters(bootstrap, app)) == 1, 90, "o2 dead-lettered", procs=[(p, log)])
        registry.fail_with(401)
        produce_avro(bootstrap, url, inp, ORDER_V2, [("o3", o3)])   # a schema id the worker has not seen
        rc = p.wait(90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = open(log).read()
    assert rc == 8 and "Traceback" not in text, text[-3000:]
    assert "committing what was processed before" in text, text[-3000:]
    assert committed_offsets(bootstrap, app, inp, 1)[0] == 2   # o1 and o2, not o3

    registry.fail_with(None)
    run_until(spec, bootstrap, app, tmp_path / "s", url, env, log,
              lambda: committed_offsets(bootstrap, app, inp, 1)[0] == 3, "offset 3 committed")
    assert outputs(bootstrap, url, out) == [("o1", order(1, 150)), ("o3", order(3, 300))]
    assert [m.key() for m in dead_letters(bootstrap, app)] == [b"o2"]
    report("an outage after a dead letter, no commit between: 3 records in, 2 out, 1 dead-lettered (once); "
           "the stop committed offset 2")
