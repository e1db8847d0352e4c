"""A poison record on the broker lands in <application-id>-dlq with provenance headers; the
records after it are processed."""

import json

from processor.kafka import clients as kafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import produce


def test_poison_record_goes_to_dlq_and_processing_continues(kafka_bootstrap, unique, tmp_path, monkeypatch):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    good = lambda amount: json.dumps({"amount": amount}).encode()  # noqa: E731
    produce(kafka_bootstrap, inp, [(b"a", good(150)), (b"b", b"{not json"), (b"c", good(300)),
                                   (b"a", good(20))])
    w = Worker(apps.filter_topology(), kafka_bootstrap, app, tmp_path, consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)

    dlq = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
    assert [(m.key(), m.value()) for m in dlq] == [(b"b", b"{not json")]
    headers = dict(dlq[0].headers())
    assert headers["__streams.errors.topic"] == inp.encode()
    assert headers["__streams.errors.partition"] == b"0"
    assert headers["__streams.errors.offset"] == b"1"
    assert headers["processor.errors.step"] == b"KTABLE-SOURCE-0000000000"
    assert headers["__streams.errors.exception"] == b"json.decoder.JSONDecodeError"

    outs = [(m.key(), m.value()) for m in kafka.read_topic(kafka_bootstrap, out)]
    assert outs == [(b"a", b'{"amount": 150}'), (b"c", b'{"amount": 300}'), (b"a", None)]
    assert w.metrics()["task"]["dead_lettered"] == 1
