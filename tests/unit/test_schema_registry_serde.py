"""Serdes.avro(schema, registry=...): the client library's own in-memory registry (``mock://``),
real fastavro, real confluent_kafka serializers on the producing side."""

import json
import pickle
import uuid

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from processor import StreamsBuilder
from processor.errors import ConfigError, TopologyError
from processor.kafka.client_config import build_client_config
from processor.serde import SCHEMAS_DIR, Serdes
from processor.serde.change import ChangeSerde
from processor.serde.registry import RegistryAvroSerde, client_for
from processor.testing import TopologyTestDriver

ORDER_V1 = json.loads((SCHEMAS_DIR / "order.avsc").read_text())
ORDER_V2 = {**ORDER_V1, "fields": ORDER_V1["fields"] + [{"name": "note", "type": "string", "default": ""}]}
# amount changes type: a record written with it cannot be read into the reader schema (v1)
ORDER_BAD = {**ORDER_V1, "fields": [f if f["name"] != "amount" else {"name": "amount", "type": "string"}
                                    for f in ORDER_V1["fields"]]}
O1 = {"id": "o1", "customer_id": "c1", "amount": 150, "status": "NEW"}


@pytest.fixture
def url():
    return f"mock://unit-{uuid.uuid4().hex[:8]}"


def writer(url, schema, topic, is_key=False):
    """A producer-side serializer (as an upstream service would use) on this process's client."""
    ser = AvroSerializer(client_for({"url": url}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
    return lambda v: ser(v, ctx)


def test_records_of_a_v2_writer_are_read_into_the_reader_schema(url):
    serde = Serdes.avro("order", registry=url).for_topic("orders", False)
    v1, v2 = writer(url, ORDER_V1, "orders"), writer(url, ORDER_V2, "orders")
    b1, b2 = v1(O1), v2({**O1, "id": "o2", "note": "gift"})
    assert b1[1:5] != b2[1:5]                       # two writer schema ids
    assert [serde.deserialize(b1), serde.deserialize(b2)] == [O1, {**O1, "id": "o2"}]
    # and the other way round: a v2 reader fills the added field's default into v1 records
    reader_v2 = Serdes.avro(ORDER_V2, registry=url).for_topic("orders", False)
    assert reader_v2.deserialize(b1) == {**O1, "note": ""}


def test_an_incompatible_writer_schema_fails_with_the_reason(url):
    serde = Serdes.avro("order", registry=url).for_topic("orders", False)
    bad = writer(url, ORDER_BAD, "orders")({**O1, "amount": "a lot"})
    sid = int.from_bytes(bad[1:5], "big")
    with pytest.raises(ValueError) as exc:
        serde.deserialize(bad)
    assert str(exc.value).startswith(f"writer schema id {sid} cannot be read into the reader schema "
                                     f"processor.example.Order (incompatible change): ")


def test_an_unknown_schema_id_fails_with_the_reason(url):
    serde = Serdes.avro("order", registry=url).for_topic("orders", False)
    with pytest.raises(ValueError) as exc:
        serde.deserialize(b"\x00\x00\x00\x03\xe7" + b"\x02x")
    assert str(exc.value) == f"writer schema id 999 not found in the registry at {url}: Schema Not Found"
    with pytest.raises(ValueError, match="not a Schema Registry frame"):
        serde.deserialize(b'{"id": "o1"}')


def test_writing_uses_the_topic_name_strategy_and_auto_registration_is_configurable(url):
    client = client_for({"url": url})
    key = Serdes.avro({"type": "string"}, registry=url).for_topic("out", True)
    value = Serdes.avro("order", registry=url).for_topic("out", False)
    kb, vb = key.serialize("o1"), value.serialize(O1)
    assert sorted(client.get_subjects()) == ["out-key", "out-value"]
    assert int.from_bytes(vb[1:5], "big") == client.get_latest_version("out-value").schema_id
    assert (key.deserialize(kb), value.deserialize(vb)) == ("o1", O1)

    strict = Serdes.avro("order", registry=url, auto_register=False).for_topic("strict-out", False)
    with pytest.raises(ValueError) as exc:
        strict.serialize(O1)
    assert str(exc.value) == (f"schema processor.example.Order under subject 'strict-out-value' at {url}: it is "
                              f"not registered there and auto-registration is off for this output "
                              f"(Schema Not Found)")
    assert "strict-out-value" not in client.get_subjects()
    # registered by whoever owns the subject: now it writes, with the registered id
    from confluent_kafka.schema_registry import Schema

    sid = client.register_schema("strict-out-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    strict = Serdes.avro("order", registry=url, auto_register=False).for_topic("strict-out", False)
    assert int.from_bytes(strict.serialize(O1)[1:5], "big") == sid


def test_an_unbound_registry_serde_refuses_to_work(url):
    serde = Serdes.avro("order", registry=url)
    good = writer(url, ORDER_V1, "orders")(O1)
    for call, arg in ((serde.serialize, O1), (serde.deserialize, good)):
        with pytest.raises(ValueError, match="is bound to no topic"):
            call(arg)
    assert serde.serialize(None) is None and serde.deserialize(None) is None


def test_a_serde_pickles_by_its_settings_and_reconnects_lazily(url):
    client = client_for({"url": url})
    by_client = Serdes.avro("order", registry=client).for_topic("orders", False)
    good = writer(url, ORDER_V2, "orders")({**O1, "note": "x"})
    assert by_client.deserialize(good) == O1           # its client now exists, with locks in it
    copy = pickle.loads(pickle.dumps(by_client))
    assert copy == by_client and copy._deserializer is None
    assert copy.deserialize(good) == O1                # in this process: the same in-memory registry
    assert copy._deserializer._registry is client


def test_the_topology_binds_sources_sinks_and_store_changelogs_and_leaves_other_serdes_alone(url):
    reg = Serdes.avro("order", registry=url)
    b = StreamsBuilder()
    orders = b.table("orders", key_serde=Serdes.string(), value_serde=reg)
    orders.group_by(lambda k, v: (v["customer_id"], v), value_serde=reg) \
        .aggregate(lambda: 0, lambda k, v, a: a + v["amount"], lambda k, v, a: a - v["amount"], name="totals") \
        .to_stream().to("totals")
    b.stream("events", key_serde=Serdes.string(), value_serde=Serdes.json()).to("events-copy")
    orders.filter(lambda k, v: v["amount"] > 100).to_stream().to("big", value_serde=reg)
    topo = b.build().for_application("app")

    def bound(node):
        return node.attrs.key_serde, node.attrs.value_serde

    src = topo.source_node("orders")
    assert (src.attrs.value_serde.topic, src.attrs.value_serde.is_key) == ("orders", False)
    assert src.attrs.key_serde is Serdes.string()              # not a registry serde: itself
    [big] = topo.sink_nodes("big")
    assert big.attrs.value_serde.subject == "big-value" and big.attrs.passthrough is False
    [repart] = [n for n in topo.nodes if n.sink_topic and n.attrs.internal]
    assert isinstance(repart.attrs.value_serde, ChangeSerde)
    assert repart.attrs.value_serde.inner.subject == "app-totals-repartition-value"
    [store] = [s for s in topo.stores.values() if s.source_topic == "orders"]
    assert store.value_serde.subject == "orders-value"       # a table source's store: the topic's bytes
    [ev] = topo.source_nodes("events")
    [copy] = topo.sink_nodes("events-copy")
    assert bound(ev) == (Serdes.string(), Serdes.json()) and bound(ev)[1] is Serdes.json()
    assert copy.attrs.passthrough is True                     # unchanged for serdes without a topic

    # operator state cannot take a registry serde: refused when the topology is bound, not per record
    b = StreamsBuilder()
    b.stream("orders", key_serde=Serdes.string(), value_serde=reg).group_by_key() \
        .reduce(lambda a, v: v, name="latest").to_stream().to("latest")
    with pytest.raises(TopologyError, match="store 'latest' .* has the Schema Registry serde"):
        b.build().for_application("app")


def test_driver_reserializes_into_the_output_subject_across_a_schema_change(url):
    """A source-to-sink pass-through does not copy the input's bytes (their schema id belongs to
    another subject and writer): every output is written with the output serde's schema."""
    reg = Serdes.avro("order", registry=url)
    b = StreamsBuilder()
    b.stream("orders", key_serde=Serdes.string(), value_serde=reg) \
        .filter(lambda k, v: v["amount"] > 100).to("big")
    v2 = writer(url, ORDER_V2, "orders")
    with TopologyTestDriver(b.build()) as driver:
        driver.pipe_input("orders", "o1", O1, timestamp=1)      # written with the source's serde (v1)
        driver.pipe_raw("orders", b"o2", v2({**O1, "id": "o2", "note": "n"}), timestamp=2)
        driver.pipe_raw("orders", b"o3", v2({**O1, "id": "o3", "amount": 5, "note": "n"}), timestamp=3)
        raw = driver.read_output("big", key_serde=Serdes.bytes(), value_serde=Serdes.bytes())
        assert driver.read_output(driver.dlq_topic) == []
    client = client_for({"url": url})
    out_id = client.get_latest_version("big-value").schema_id
    assert json.loads(client.get_schema(out_id).schema_str) == ORDER_V1
    assert [(r.key, r.value[:5], r.timestamp) for r in raw] == [(b"o1", b"\x00" + out_id.to_bytes(4, "big"), 1),
                                                                 (b"o2", b"\x00" + out_id.to_bytes(4, "big"), 2)]
    out = Serdes.avro("order", registry=url).for_topic("big", False)
    assert [out.deserialize(r.value) for r in raw] == [O1, {**O1, "id": "o2"}]


def test_registry_settings_come_through_the_client_configuration(url, tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("bootstrap.servers=b:9092\nsecurity.protocol=SASL_SSL\n"
                     "schema.registry.url=http://code-default:8081\n"
                     "basic.auth.credentials.source=USER_INFO\n"
                     "basic.auth.user.info=KEY:S3CRET\n")
    cfg = build_client_config([str(props)], [], registry_url=url,
                              registry_pairs=["auto.register.schemas=false"])
    assert cfg.registry == {"url": url, "basic.auth.user.info": "KEY:S3CRET", "auto.register.schemas": "false"}
    assert "schema.registry.url" not in cfg.common and "basic.auth.user.info" not in cfg.common
    assert cfg.ignored == ()
    assert "S3CRET" not in cfg.describe() and "S3CRET" not in repr(cfg)
    assert f"schema registry: auto.register.schemas=false basic.auth.user.info=***** url={url}" in cfg.describe()

    b = StreamsBuilder()
    b.stream("in", key_serde=Serdes.string(), value_serde=Serdes.avro("order", registry="http://code:1")) \
        .to("out")
    topo = b.build().for_application("app", cfg.registry)
    [sink] = topo.sink_nodes("out")
    serde = sink.attrs.value_serde
    assert serde.conf == {"url": url, "basic.auth.user.info": "KEY:S3CRET"}   # the host's URL wins
    assert serde.auto_register is False
    assert "S3CRET" not in repr(serde)
    topo.check_serde_settings()
    bad = b.build().for_application("app", {"url": url, "ssl.truststore.location": "/x.jks"})
    with pytest.raises(ConfigError, match="Unrecognized properties: ssl.truststore.location"):
        bad.check_serde_settings()
    with pytest.raises(ConfigError, match="auto.register.schemas must be true or false"):
        b.build().for_application("app", {"auto.register.schemas": "maybe"})


def test_fixed_schema_avro_is_unchanged():
    fixed = Serdes.avro("order", 7)
    assert type(fixed) is not RegistryAvroSerde and fixed.for_topic("t", False) is fixed
    assert fixed.serialize(O1)[:5] == b"\x00\x00\x00\x00\x07"
    with pytest.raises(ValueError, match="schema_id is for the fixed-schema serde"):
        Serdes.avro("order", 7, registry="mock://x")


def test_a_foreign_key_join_refuses_a_registry_right_table_and_joins_one_mapped_first(url):
    """The join sends right rows through its response topic; a registry serde is bound to a topic
    only for sources, sinks and stores: refused when the join is built, naming the remedy, which
    works (the right table mapped into a table of JSON values)."""
    customer = json.loads((SCHEMAS_DIR / "customer.avsc").read_text())

    def build(mapped):
        b = StreamsBuilder()
        orders = b.table("orders", key_serde=Serdes.string(), value_serde=Serdes.json())
        customers = b.table("customers", key_serde=Serdes.string(), value_serde=Serdes.avro("customer", registry=url))
        right = customers.map_values(lambda v: v) if mapped else customers
        orders.join_on_foreign_key(right, lambda o: o["customer"], lambda o, c: {"n": o["n"], "name": c["name"]},
                                   name="enriched").to_stream().to("out")
        return b.build()

    with pytest.raises(TopologyError, match="right table's value serde .* Schema Registry serde.*map it"):
        build(mapped=False)
    with TopologyTestDriver(build(mapped=True)) as d:
        d.pipe_raw("customers", b"c1",
                   writer(url, customer, "customers")({"id": "c1", "name": "Ann", "region": "eu"}), 1)
        d.pipe_raw("orders", b"o1", json.dumps({"customer": "c1", "n": 5}).encode(), 2)
        assert [(r.key, r.value) for r in d.read_output("out")] == [("o1", {"n": 5, "name": "Ann"})]
        assert d.metrics()["task"]["dead_lettered"] == 0
