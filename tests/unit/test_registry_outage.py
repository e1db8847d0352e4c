"""Issue 47, item 2: a Schema Registry that cannot be used is not a bad record.

The registry is ``tests/support/schema_registry_server.py`` over real HTTP (its switches: down,
a status for every answer, a delay), the client confluent-kafka's real ``SchemaRegistryClient``:
an outage (connection refused, a timeout, 5xx, 429) or refused credentials (401/403) are waited
out with back-off, counted and logged once per kind, then ``SchemaRegistryUnavailable`` (exit
code 8, not a record error: never dead-lettered); an unknown schema id or bytes that are no
frame stay the record's (``ValueError``, then the on-error policy)."""

import json
import logging
import threading
import time

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import OAuthTokenError, SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from processor import StreamsBuilder
from processor.engine.global_tables import apply_global_record
from processor.errors import ProcessorError, RecordError, SchemaRegistryUnavailable, is_operational
from processor.serde import SCHEMAS_DIR, Serdes
from processor.serde.registry import DEFAULT_OUTAGE_TIMEOUT_MS, client_for, failure_kind, retry_counts
from processor.testing import TopologyTestDriver
from tests.support.schema_registry_server import SchemaRegistryServer

ORDER = json.loads((SCHEMAS_DIR / "order.avsc").read_text())
O1 = {"id": "o1", "customer_id": "c1", "amount": 150, "status": "NEW"}
# the client library's own retries off: each failure reaches the serde at once (tests stay fast)
FAST = {"max.retries": 0}


@pytest.fixture
def registry():
    with SchemaRegistryServer() as server:
        yield server


def written(url: str, topic: str, value: dict) -> bytes:
    """``value`` framed by an upstream producer's serializer (its schema registered)."""
    ser = AvroSerializer(client_for({"url": url}), json.dumps(ORDER))
    return ser(value, SerializationContext(topic, MessageField.VALUE))


def reader(url: str, topic: str, outage_ms: int, **client):
    """A value serde bound to ``topic`` by the host's registry settings, as the worker binds it."""
    return Serdes.avro("order", registry=url).for_topic(topic, False, {**FAST, **client,
                                                                       "outage.timeout.ms": str(outage_ms)})


def test_failure_kinds():
    from confluent_kafka.schema_registry.common._httpx_compat import httpx

    assert failure_kind(httpx.ConnectError("[Errno 111] Connection refused")) == "unreachable"
    assert failure_kind(httpx.RemoteProtocolError("reset")) == "unreachable"
    assert failure_kind(httpx.ReadTimeout("timed out")) == "timeout"
    assert failure_kind(httpx.ConnectTimeout("timed out")) == "timeout"
    for status, kind in ((500, "unavailable"), (502, "unavailable"), (503, "unavailable"), (504, "unavailable"),
                         (408, "unavailable"), (429, "throttled"), (401, "unauthorized"), (403, "unauthorized")):
        assert failure_kind(SchemaRegistryError(status, status, "x")) == kind, status
    assert failure_kind(OAuthTokenError("no token", 401)) == "unauthorized"
    for status, code in ((404, 40403), (404, 40401), (404, 404), (409, 409), (422, 42201), (400, 400)):
        assert failure_kind(SchemaRegistryError(status, code, "x")) is None, (status, code)
    assert failure_kind(ValueError("not avro")) is None
    wrapped = ValueError("wrapped")
    wrapped.__cause__ = httpx.ConnectError("refused")
    assert failure_kind(wrapped) == "unreachable"
    # an error of this package about no record: the operators let it through, never reject the record
    assert is_operational(SchemaRegistryUnavailable("x")) and not issubclass(SchemaRegistryUnavailable, RecordError)
    assert SchemaRegistryUnavailable.exit_code == 8 and issubclass(SchemaRegistryUnavailable, ProcessorError)


def test_the_bound_is_a_registry_setting(registry):
    assert Serdes.avro("order", registry=registry.url).for_topic("t", False).outage_timeout_ms == \
        DEFAULT_OUTAGE_TIMEOUT_MS == 60_000
    assert reader(registry.url, "t", 1500).outage_timeout_ms == 1500
    assert Serdes.avro("order", registry={"url": registry.url, "outage.timeout.ms": 700}).outage_timeout_ms == 700
    from processor.errors import ConfigError

    with pytest.raises(ConfigError, match="outage.timeout.ms must be a whole number"):
        Serdes.avro("order", registry=registry.url).for_topic("t", False, {"outage.timeout.ms": "soon"})


def test_a_read_waits_out_a_registry_that_is_down_and_reads_the_record(registry, caplog):
    data = written(registry.url, "orders", O1)
    serde = reader(registry.url, "orders", 20_000)
    registry.down()
    before = retry_counts()["unreachable"]
    threading.Timer(1.5, registry.up).start()
    with caplog.at_level(logging.WARNING, logger="processor.serde.registry"):
        t0 = time.monotonic()
        assert serde.deserialize(data) == O1
        waited = time.monotonic() - t0
    assert 1.4 < waited < 10
    assert retry_counts()["unreachable"] - before >= 2     # 0.5 s, 1 s, 2 s... back-off
    warnings = [r.getMessage() for r in caplog.records   # (its own lines: not httpx's, at a CI run's INFO)
                if r.name == "processor.serde.registry" and r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings                      # one per kind, and one when it answers again
    assert warnings[0].startswith(f"the Schema Registry at {registry.url} cannot be used (unreachable: ConnectError")
    assert "reading writer schema id 1 of a record of topic 'orders' (value)" in warnings[0]
    assert warnings[1].startswith(f"the Schema Registry at {registry.url} answers again")


def test_refused_credentials_are_retried_then_unavailable_with_one_warning(registry, caplog):
    data = written(registry.url, "orders", O1)
    registry.fail_with(401)
    serde = reader(registry.url, "orders", 1000)
    before = retry_counts()["unauthorized"]
    with caplog.at_level(logging.WARNING, logger="processor.serde.registry"):
        for _ in range(3):   # three records: one warning, not one per record
            t0 = time.monotonic()
            with pytest.raises(SchemaRegistryUnavailable) as exc:
                serde.deserialize(data)
            assert 1.0 <= time.monotonic() - t0 < 6.0   # (the bound, then at most one step: generous for CI)
    assert str(exc.value).startswith(
        f"the Schema Registry at {registry.url} could not be used for 1.0 s (outage.timeout.ms=1000, ")
    assert ("reading writer schema id 1 of a record of topic 'orders' (value): unauthorized, "
            "HTTP 401: Unauthorized; stopping without committing the record (it is read again after a restart)"
            ) in str(exc.value)
    assert "\n" not in str(exc.value)
    assert retry_counts()["unauthorized"] - before >= 6
    assert len([r for r in caplog.records if "cannot be used" in r.getMessage()]) == 1
    registry.fail_with(None)
    assert serde.deserialize(data) == O1


@pytest.mark.parametrize("status, kind", [(503, "unavailable"), (429, "throttled"), (403, "unauthorized")])
def test_server_errors_and_throttling_are_waited_out(registry, status, kind):
    data = written(registry.url, "orders", O1)
    registry.fail_with(status)
    serde = reader(registry.url, "orders", 10_000)
    threading.Timer(0.8, registry.fail_with, (None,)).start()
    before = retry_counts()[kind]
    assert serde.deserialize(data) == O1
    assert retry_counts()[kind] > before


def test_a_registry_that_does_not_answer_times_out(registry):
    data = written(registry.url, "orders", O1)
    registry.delay_s = 2.0
    serde = reader(registry.url, "orders", 500, timeout=0.3)
    with pytest.raises(SchemaRegistryUnavailable, match=r"timeout, ReadTimeout"):
        serde.deserialize(data)


def test_an_unknown_schema_id_and_bytes_that_are_no_frame_stay_bad_records(registry):
    serde = reader(registry.url, "orders", 60_000)
    before = sum(retry_counts().values())
    t0 = time.monotonic()
    with pytest.raises(ValueError) as exc:
        serde.deserialize(b"\x00\x00\x00\x7f\xff\x04o9")
    assert str(exc.value) == f"writer schema id 32767 not found in the registry at {registry.url}: Schema not found"
    with pytest.raises(ValueError, match="not a Schema Registry frame"):
        serde.deserialize(b"\x07junk")
    assert time.monotonic() - t0 < 5 and sum(retry_counts().values()) == before   # no retry, no wait


def test_a_write_waits_out_an_outage_and_then_registers(registry):
    serde = Serdes.avro("order", registry=registry.url).for_topic("big", False, {**FAST, "outage.timeout.ms": "800"})
    registry.fail_with(503)
    with pytest.raises(SchemaRegistryUnavailable) as exc:
        serde.serialize(O1)
    assert (f"the Schema Registry at {registry.url} could not be used" in str(exc.value)
            and "registering schema processor.example.Order under subject 'big-value': unavailable, HTTP 503: "
                "Service Unavailable" in str(exc.value))
    registry.fail_with(None)
    assert serde.serialize(O1)[1:5] == (1).to_bytes(4, "big")


def test_the_driver_neither_dead_letters_nor_skips_a_record_that_met_an_outage(registry):
    """Through the engine (sources, sinks, the task): the error passes through as it is under every
    on-error policy, on the read side and on the write side."""
    data = written(registry.url, "orders", O1)
    conf = {"url": registry.url, "outage.timeout.ms": 300, **FAST}
    b = StreamsBuilder()
    b.stream("orders", key_serde=Serdes.string(), value_serde=Serdes.avro("order", registry=conf)) \
        .to("copy", value_serde=Serdes.json())
    b.stream("json-orders", key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .to("avro-orders", value_serde=Serdes.avro("order", registry=conf))
    topology = b.build()
    for policy in ("dlq", "skip", "fail"):
        registry.fail_with(401)
        with TopologyTestDriver(topology, on_error=policy) as d:
            with pytest.raises(SchemaRegistryUnavailable, match="reading writer schema id 1"):
                d.pipe_raw("orders", b"o1", data, timestamp=1)
            with pytest.raises(SchemaRegistryUnavailable, match="under subject 'avro-orders-value'"):
                d.pipe_input("json-orders", "o1", O1, timestamp=2)
            if policy == "dlq":
                assert d.read_output(d.dlq_topic) == []
            registry.fail_with(None)
            d.pipe_raw("orders", b"o1", data, timestamp=3)
            assert [r.value for r in d.read_output("copy")] == [O1]


def test_a_global_table_does_not_skip_a_record_that_met_an_outage():
    class Down:
        def deserialize(self, data):
            raise SchemaRegistryUnavailable("the Schema Registry at http://r could not be used")

    class Spec:
        key_serde, value_serde, timestamp_extractor = Serdes.string(), Down(), None

    with pytest.raises(SchemaRegistryUnavailable):
        apply_global_record({}, Spec, b"k", b"v", 1)


def test_the_retries_are_a_metric_of_the_worker():
    from processor.runtime.worker_metrics import WorkerMetrics

    family = [f for f in WorkerMetrics().registry.collect() if f.name == "processor_registry_retries"]
    assert len(family) == 1
    samples = {s.labels["kind"]: s.value for s in family[0].samples if s.name.endswith("_total")}
    assert samples == {k: float(v) for k, v in retry_counts().items()}
    assert set(samples) == {"unreachable", "timeout", "unavailable", "throttled", "unauthorized"}
