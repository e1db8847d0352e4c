"""Issue 47, item 2: the backfill meets a Schema Registry that cannot be used as the worker does.

Real local Spark, the real broker, the registry ``tests/support/schema_registry_server.py`` over
HTTP, reached by the executors: down, the executors' serdes wait it out for
``outage.timeout.ms`` (1.5 s here), then the backfill fails with the worker's error
(``SchemaRegistryUnavailable``, exit code 8, one line naming the registry); it dead-letters
nothing, hands nothing over (no committed group offsets, no task directory). With the registry
back, the same backfill runs to the end with every record."""

import json
import time

import pytest

import backfill
from processor import StreamsBuilder
from processor.errors import SchemaRegistryUnavailable
from processor.kafka import clients as kafka
from processor.kafka.client_config import build_client_config
from processor.serde import SCHEMAS_DIR, Serdes
from tests.integration.helpers import committed_offsets
from tests.integration.test_registry_outage import produce_avro
from tests.support.schema_registry_server import SchemaRegistryServer

ORDER = json.loads((SCHEMAS_DIR / "order.avsc").read_text())


def topology(inp: str, out: str):
    b = StreamsBuilder()
    b.stream(inp, key_serde=Serdes.string(), value_serde=Serdes.avro("order", registry="http://127.0.0.1:9")) \
        .group_by_key().count(name="counts").to_stream().to(out)
    return b.build()


@pytest.mark.integration
def test_a_backfill_fails_fast_on_a_registry_outage_and_runs_once_it_is_back(kafka_bootstrap, spark, tmp_path,
                                                                             unique, report):
    inp, out, app = f"bro-in-{unique}", f"bro-out-{unique}", f"bro-{unique}"
    kafka.create_topics(kafka_bootstrap, {inp: 2, out: 2})
    with SchemaRegistryServer() as registry:
        rows = [(f"k{i % 7}", {"id": f"o{i}", "customer_id": "c", "amount": i, "status": "NEW"}) for i in range(40)]
        produce_avro(kafka_bootstrap, registry.url, inp, ORDER, rows)
        config = build_client_config(registry_url=registry.url, registry_pairs=["outage.timeout.ms=1500"])

        registry.down()
        t0 = time.monotonic()
        with pytest.raises(SchemaRegistryUnavailable) as exc:
            backfill.run(topology(inp, out), bootstrap_servers=kafka_bootstrap, application_id=app,
                         state_dir=tmp_path, spark=spark, client_config=config)
        took = time.monotonic() - t0
        assert exc.value.exit_code == 8
        message = str(exc.value)
        assert message.startswith(f"the Schema Registry at {registry.url} could not be used for ") and \
            "(outage.timeout.ms=1500, " in message and "unreachable, ConnectError" in message, message
        assert "\n" not in message
        assert kafka.read_topic(kafka_bootstrap, f"{app}-dlq") == []   # (created at start, empty)
        assert all(o <= 0 for o in committed_offsets(kafka_bootstrap, app, inp, 2).values())
        assert not (tmp_path / app).exists() or not any((tmp_path / app).glob("task-*"))

        registry.up()
        rep = backfill.run(topology(inp, out), bootstrap_servers=kafka_bootstrap, application_id=app,
                           state_dir=tmp_path, spark=spark, client_config=config, emit_outputs=True)
        assert rep.rows_read == len(rows)
        assert sum(committed_offsets(kafka_bootstrap, app, inp, 2).values()) == len(rows)   # handed over
        counts = {}
        for m in kafka.read_topic(kafka_bootstrap, out):
            counts[m.key().decode()] = json.loads(m.value())
        assert counts == {f"k{j}": sum(1 for k, _ in rows if k == f"k{j}") for j in range(7)}
        assert f"{app}-dlq" not in kafka.topic_partitions(kafka_bootstrap) or \
            kafka.read_topic(kafka_bootstrap, f"{app}-dlq") == []
    report(f"backfill, registry down (bound 1500 ms): failed in {took:.1f} s with exit code 8, nothing "
           f"dead-lettered or handed over; back up: {len(rows)} records in, counts of 7 keys out, 0 dead-lettered")
