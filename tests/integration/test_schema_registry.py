"""Schema Registry serdes on the broker: a worker reading Avro whose producer changes schema.

The registry is the client library's in-memory one (``mock://``), which lives in one process,
so the worker runs here, in the test's process (``Worker(...).run(until_drained=True)``), and
shares it with the producing serializers."""

import json

from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor import StreamsBuilder
from processor.kafka import clients as kafka
from processor.kafka.client_config import build_client_config
from processor.runtime.worker import Worker
from processor.serde import SCHEMAS_DIR, Serdes
from processor.serde.registry import client_for
from tests.conftest import TEST_CONSUMER_CONFIG

ORDER_V1 = json.loads((SCHEMAS_DIR / "order.avsc").read_text())
# v2: a field added with a default (a backward-compatible change)
ORDER_V2 = {**ORDER_V1, "fields": ORDER_V1["fields"] + [{"name": "note", "type": "string", "default": ""}]}
# amount turned into a string: not readable as the reader's int
ORDER_BAD = {**ORDER_V1, "fields": [f if f["name"] != "amount" else {"name": "amount", "type": "string"}
                                    for f in ORDER_V1["fields"]]}


def order(i, amount, **extra):
    return {"id": f"o{i}", "customer_id": f"c{i % 3}", "amount": amount, "status": "NEW", **extra}


def big_orders(inp, out, registry):
    """orders (Avro, registry) -> amount > 100 -> big orders (Avro, registry, the reader schema)."""
    b = StreamsBuilder()
    b.stream(inp, key_serde=Serdes.string(), value_serde=Serdes.avro("order", registry=registry)) \
        .filter(lambda k, v: v["amount"] > 100) \
        .to(out, value_serde=Serdes.avro("order", registry=registry))
    return b.build()


def produce_avro(bootstrap, url, topic, schema, records):
    """An upstream producer with its own writer schema (TopicNameStrategy, auto-registered)."""
    ser = AvroSerializer(client_for({"url": url}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        p.produce(topic, key=key.encode(), value=value if isinstance(value, bytes) else ser(value, ctx))
    assert p.flush(30) == 0


def run_worker(topology, bootstrap, app, state_dir, **kw):
    w = Worker(topology, bootstrap, app, state_dir, consumer_config=TEST_CONSUMER_CONFIG, **kw)
    w.run(until_drained=True, install_signal_handlers=False)
    return w


def read_orders(bootstrap, url, topic):
    """(key, schema id of the frame, value read with the writer's schema) of every record."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    de = AvroDeserializer(client_for({"url": url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [(m.key().decode(), int.from_bytes(m.value()[1:5], "big"), de(m.value(), ctx))
            for m in kafka.read_topic(bootstrap, topic)]


def test_a_producer_moving_to_v2_mid_stream_dead_letters_nothing(kafka_bootstrap, unique, tmp_path):
    inp, out, app, url = f"orders-{unique}", f"big-{unique}", f"app-{unique}", f"mock://it-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    topo = big_orders(inp, out, url)

    produce_avro(kafka_bootstrap, url, inp, ORDER_V1, [("o1", order(1, 150)), ("o2", order(2, 50))])
    w1 = run_worker(topo, kafka_bootstrap, app, tmp_path)
    # the producer moves to v2 while the application runs; an old v1 producer is still around
    produce_avro(kafka_bootstrap, url, inp, ORDER_V2, [("o3", order(3, 300, note="gift")),
                                                      ("o4", order(4, 20, note=""))])
    produce_avro(kafka_bootstrap, url, inp, ORDER_V1, [("o5", order(5, 500))])
    produce_avro(kafka_bootstrap, url, inp, ORDER_V2, [("o6", order(6, 600, note="rush"))])
    w2 = run_worker(topo, kafka_bootstrap, app, tmp_path)

    client = client_for({"url": url})
    assert len(client.get_versions(f"{inp}-value")) == 2       # the producers' v1 and v2
    out_id = client.get_latest_version(f"{out}-value").schema_id
    assert json.loads(client.get_schema(out_id).schema_str) == ORDER_V1   # written with the reader schema
    assert read_orders(kafka_bootstrap, url, out) == [
        ("o1", out_id, order(1, 150)), ("o3", out_id, order(3, 300)),
        ("o5", out_id, order(5, 500)), ("o6", out_id, order(6, 600))]
    assert (w1.metrics()["task"]["dead_lettered"], w2.metrics()["task"]["dead_lettered"]) == (0, 0)
    assert (w1.records_processed, w2.records_processed) == (2, 4)
    assert f"{app}-dlq" not in kafka.topic_partitions(kafka_bootstrap) or \
        kafka.read_topic(kafka_bootstrap, f"{app}-dlq") == []


def test_an_incompatible_schema_goes_to_the_dead_letter_topic_with_the_reason(kafka_bootstrap, unique,
                                                                               tmp_path):
    """The registry URL of the code is a placeholder: the worker's registry comes from its client
    configuration (--schema-registry-url), as in a deployment."""
    inp, out, app, url = f"orders-{unique}", f"big-{unique}", f"app-{unique}", f"mock://it-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 1, out: 1})
    unknown_id = b"\x00\x00\x00\x7f\xff" + b"\x04o9"          # schema id 32767: never registered
    produce_avro(kafka_bootstrap, url, inp, ORDER_V1, [("o1", order(1, 150))])
    produce_avro(kafka_bootstrap, url, inp, ORDER_BAD, [("o2", order(2, "a lot"))])
    produce_avro(kafka_bootstrap, url, inp, ORDER_V1, [("o3", order(3, 300)), ("o4", unknown_id)])
    produce_avro(kafka_bootstrap, url, inp, ORDER_V2, [("o5", order(5, 500, note="n"))])

    config = build_client_config(registry_url=url)
    w = run_worker(big_orders(inp, out, "http://127.0.0.1:9/placeholder"), kafka_bootstrap, app, tmp_path,
                   client_config=config)

    assert [(k, v) for k, _, v in read_orders(kafka_bootstrap, url, out)] == [
        ("o1", order(1, 150)), ("o3", order(3, 300)), ("o5", order(5, 500))]
    dlq = kafka.read_topic(kafka_bootstrap, f"{app}-dlq")
    assert [m.key() for m in dlq] == [b"o2", b"o4"]
    assert dlq[1].value() == unknown_id                       # the original bytes
    bad_id = int.from_bytes(dlq[0].value()[1:5], "big")
    assert json.loads(client_for({"url": url}).get_schema(bad_id).schema_str) == ORDER_BAD
    headers = [dict(m.headers()) for m in dlq]
    step = b"KSTREAM-SOURCE-0000000000"
    assert [(h["__streams.errors.topic"], h["__streams.errors.offset"], h["processor.errors.step"])
            for h in headers] == [(inp.encode(), b"1", step), (inp.encode(), b"3", step)]
    failed = (f"step KSTREAM-SOURCE-0000000000: value deserialization with "
              f"Serdes.avro('Order', registry='{url}', topic='{inp}') failed: ValueError: writer schema id")
    assert [h["__streams.errors.message"].decode() for h in headers] == [
        f"record {inp}[0]@1, {failed} {bad_id} cannot be read into the reader schema processor.example.Order "
        f"(incompatible change): Schema mismatch: string is not int",
        f"record {inp}[0]@3, {failed} 32767 not found in the registry at {url}: Schema Not Found"]
    assert w.metrics()["task"]["dead_lettered"] == 2
