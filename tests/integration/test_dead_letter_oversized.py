"""Records too large to dead-letter whole, on Apache Kafka with its default size limits.

A topic takes records up to its ``max.message.bytes`` (1,048,588 by default) while the worker's
producer sends at most ``message.max.bytes`` (librdkafka's 1,000,000): an input between the two,
poison (not JSON) or with an output too large, is dead-lettered as a stub (its key and value cut,
``processor.errors.truncated`` saying so) and processing goes on. Across restarts, each input is
dead-lettered once and every good record is processed once."""

import json

import pytest
from confluent_kafka import Producer

from processor.engine.dead_letters import TRUNCATED_HEADER
from processor.engine.record_size import DEFAULT_MAX_RECORD_BYTES, wire_size
from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps

BIG = 1_040_000   # a value between the producer's limit and the topic's


def produce_large(bootstrap, topic, records):
    """(key, value) records through a producer allowed the topic's own limit (1,048,588)."""
    p = Producer({**kafka.producer_defaults(bootstrap), "message.max.bytes": 1_048_588})
    errors = []
    for key, value in records:
        p.produce(topic, value, key, on_delivery=lambda err, msg: err and errors.append(err))
    assert p.flush(30) == 0 and errors == []


def run(bootstrap, app, state_dir, guarantee):
    w = Worker(apps.filter_topology(), bootstrap, app, state_dir, consumer_config=TEST_CONSUMER_CONFIG,
               processing_guarantee=guarantee)
    w.run(until_drained=True, install_signal_handlers=False)
    return w


def good(amount):
    return json.dumps({"amount": amount}).encode()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_an_input_too_large_to_dead_letter_whole_goes_as_a_stub_and_processing_goes_on(
        apache_kafka_bootstrap, unique, tmp_path, monkeypatch, guarantee):
    bootstrap = apache_kafka_bootstrap
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    poison = b"{" + b"x" * BIG                                            # not JSON
    too_large_out = json.dumps({"amount": 500, "pad": "y" * BIG}).encode()   # its output is over the limit
    produce_large(bootstrap, inp, [(b"a", good(150)), (b"p", poison), (b"b", good(300)),
                                   (b"q", too_large_out), (b"c", good(5))])
    w = run(bootstrap, app, tmp_path, guarantee)
    assert w.metrics()["task"]["dead_lettered"] == 2
    assert w.metrics()["task"]["dead_lettered_cut"] == 2

    # a restart, then more input, one of it too large again: nothing before is dead-lettered again
    produce_large(bootstrap, inp, [(b"d", good(700)), (b"r", b"[" + b"z" * BIG)])
    w = run(bootstrap, app, tmp_path, guarantee)
    assert w.metrics()["task"]["dead_lettered"] == 1
    run(bootstrap, app, tmp_path, guarantee)   # and a restart with nothing new

    outs = [(m.key(), m.value()) for m in kafka.read_topic(bootstrap, out)]
    assert outs == [(b"a", good(150)), (b"b", good(300)), (b"d", good(700))]   # (c: filtered out, never emitted)
    dlq = kafka.read_topic(bootstrap, f"{app}-dlq")
    assert [m.key() for m in dlq] == [b"p", b"q", b"r"]
    for m, offset, original in zip(dlq, (1, 3, 6), (poison, too_large_out, b"[" + b"z" * BIG), strict=True):
        headers = dict(m.headers())
        assert headers["__streams.errors.offset"] == str(offset).encode()
        assert headers["__streams.errors.topic"] == inp.encode()
        assert wire_size(m.key(), m.value(), m.headers()) <= DEFAULT_MAX_RECORD_BYTES
        kept = len(m.value())
        assert 990_000 < kept < len(original) and original.startswith(m.value())
        assert headers[TRUNCATED_HEADER] == f"key=1/1;value={kept}/{len(original)};headers=0/0".encode()
    assert dict(dlq[0].headers())["__streams.errors.exception"] == b"json.decoder.JSONDecodeError"
    assert b"message.max.bytes" in dict(dlq[1].headers())["__streams.errors.message"]


def test_a_dead_letter_topic_with_a_smaller_limit_than_the_producer_gets_stubs_within_its_own(
        apache_kafka_bootstrap, unique, tmp_path, monkeypatch):
    """A dead-letter topic created (by its user) with ``max.message.bytes`` below the producer's
    ``message.max.bytes``: a poison record that fits the producer but not the topic goes as a stub
    within the topic's limit, rather than a delivery the broker refuses on every restart."""
    bootstrap = apache_kafka_bootstrap
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(bootstrap, {inp: 1, out: 1})
    kafka.create_topics(bootstrap, {f"{app}-dlq": 1}, config={"max.message.bytes": "200000"})
    poison = b"{" + b"x" * 500_000
    produce_large(bootstrap, inp, [(b"a", good(150)), (b"p", poison), (b"b", good(300))])
    w = run(bootstrap, app, tmp_path, "at_least_once")
    assert w.metrics()["task"]["dead_lettered_cut"] == 1
    outs = [(m.key(), m.value()) for m in kafka.read_topic(bootstrap, out)]
    assert outs == [(b"a", good(150)), (b"b", good(300))]
    [stub] = kafka.read_topic(bootstrap, f"{app}-dlq")
    kept = len(stub.value())
    assert wire_size(stub.key(), stub.value(), stub.headers()) <= 200_000 - 61 and 190_000 < kept < len(poison)
    assert dict(stub.headers())[TRUNCATED_HEADER] == f"key=1/1;value={kept}/{len(poison)};headers=0/0".encode()
