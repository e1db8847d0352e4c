"""A dead-letter topic that refuses this application's writes, on Apache Kafka with an authorizer.

The node runs Kafka's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found``: everything
is allowed until an ACL names a resource; the test denies WRITE on the dead-letter topic to the
worker (``User:ANONYMOUS`` on a PLAINTEXT listener). Refused at start-up (the authorized
operations DescribeTopics reports, KIP-430): one line, exit 2, nothing read. Refused mid-run: the
dead-letter record fails its delivery, and the worker stops with one line (exit 7) before the
poison record's offset is committed; once writes are allowed again, a restart dead-letters it
once and processes the rest."""

import json

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from processor.kafka import clients as kafka
from processor.runtime.apache_kafka import ApacheKafka
from processor.runtime.worker import Worker
from tests.conftest import TEST_CONSUMER_CONFIG
from tests.integration import apps
from tests.integration.helpers import (
    committed_offsets,
    produce,
    start_worker_process,
    wait_for,
    wait_until_group_drained,
)
from tests.integration.test_operational_errors import assert_exit, run_args, run_worker

AUTHORIZED = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "allow.everyone.if.no.acl.found": "true"}


@pytest.fixture(scope="module")
def authorized_kafka(tmp_path_factory):
    broker = ApacheKafka(directory=tmp_path_factory.mktemp("authorized-kafka"), settings=AUTHORIZED).start()
    try:
        # a new node answers group requests once its offsets topic is loaded
        kafka.create_topics(broker.bootstrap_servers, {"warm-up": 1})
        kafka.retry_transient(lambda: committed_offsets(broker.bootstrap_servers, "warm-up", "warm-up", 1),
                              "reading a group's offsets on a new node")
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def _acls(topic):
    """ALL allowed on ``topic`` (an ACL on it ends allow-everyone there), WRITE denied (deny wins)."""
    return [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW),
            AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
                       AclOperation.WRITE, AclPermissionType.DENY)]


def deny_writes(bootstrap, topic):
    client = kafka.admin(bootstrap)   # (outlives its futures)
    for f in client.create_acls(_acls(topic)).values():
        f.result()


def allow_writes(bootstrap, topic):
    flt = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    client = kafka.admin(bootstrap)
    for f in client.delete_acls([flt]).values():
        f.result()


def good(amount):
    return json.dumps({"amount": amount}).encode()


def topics(bootstrap, unique, monkeypatch):
    inp, out, app = f"orders-{unique}", f"big-{unique}", f"app-{unique}"
    monkeypatch.setenv("APP_INPUT", inp)
    monkeypatch.setenv("APP_OUTPUT", out)
    kafka.create_topics(bootstrap, {inp: 1, out: 1, f"{app}-dlq": 1})
    return inp, out, app


def test_a_dead_letter_topic_refusing_writes_at_start_up_stops_the_worker_before_it_reads(
        authorized_kafka, unique, tmp_path, monkeypatch):
    inp, out, app = topics(authorized_kafka, unique, monkeypatch)
    deny_writes(authorized_kafka, f"{app}-dlq")
    produce(authorized_kafka, inp, [(b"a", good(150)), (b"p", b"{not json")])
    proc = run_worker(run_args("filter_topology", authorized_kafka, app, tmp_path / "s"),
                      {"APP_INPUT": inp, "APP_OUTPUT": out})
    assert_exit(proc, 2, f"the dead-letter topic '{app}-dlq'", "refuses this application's writes", "not WRITE")
    assert committed_offsets(authorized_kafka, app, inp, 1) == {0: -1001}
    assert kafka.read_topic(authorized_kafka, out) == []


def test_a_dead_letter_topic_refusing_writes_mid_run_stops_the_worker_before_the_record_is_committed(
        authorized_kafka, unique, tmp_path, monkeypatch):
    inp, out, app = topics(authorized_kafka, unique, monkeypatch)
    log = tmp_path / "worker.log"
    proc = start_worker_process(authorized_kafka, "tests.integration.apps:filter_topology", app, tmp_path / "s",
                                log, {"APP_INPUT": inp, "APP_OUTPUT": out})
    try:
        produce(authorized_kafka, inp, [(b"a", good(150)), (b"b", good(300))])
        wait_until_group_drained(authorized_kafka, app, {inp: 1}, timeout_s=60,
                                 check=lambda: proc.poll() is None or pytest.fail(log.read_text()[-3000:]))
        deny_writes(authorized_kafka, f"{app}-dlq")
        produce(authorized_kafka, inp, [(b"c", good(400)), (b"p", b"{not json"), (b"d", good(500))])
        wait_for(lambda: proc.poll() is not None, 90, "the worker stopping on the refused dead-letter record")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("processor: error: ")]
    assert proc.returncode == 7 and len(errors) == 1, text[-3000:]
    assert "Traceback" not in text
    assert f"{app}-dlq[0]" in errors[0] and "Topic authorization failed" in errors[0], errors[0]
    assert committed_offsets(authorized_kafka, app, inp, 1)[0] <= 3   # not past the poison record (offset 3)

    allow_writes(authorized_kafka, f"{app}-dlq")
    w = Worker(apps.filter_topology(), authorized_kafka, app, tmp_path / "s", consumer_config=TEST_CONSUMER_CONFIG)
    w.run(until_drained=True, install_signal_handlers=False)
    assert [(m.key(), m.value()) for m in kafka.read_topic(authorized_kafka, f"{app}-dlq")] == [(b"p", b"{not json")]
    outs = [(m.key(), m.value()) for m in kafka.read_topic(authorized_kafka, out)]
    # c and d may have gone out before the worker stopped, and again after its restart (at least once)
    assert [r for i, r in enumerate(outs) if r not in outs[:i]] == \
        [(b"a", good(150)), (b"b", good(300)), (b"c", good(400)), (b"d", good(500))]
