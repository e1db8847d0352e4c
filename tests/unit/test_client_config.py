"""Client settings: parsing, layering, Java client.properties, redaction, environment variables,
and that every client the product opens is built through the layered settings."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from processor import cli
from processor.errors import ConfigError
from processor.kafka import clients as kafka
from processor.kafka.client_config import ClientConfig, KafkaCluster, build_client_config, parse_properties, redacted

ROOT = Path(__file__).resolve().parents[2]

CLIENT_PROPERTIES = r"""
# Confluent Cloud style client.properties
bootstrap.servers=pkc-123.europe-west1.gcp.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
    username="APIKEY" password="s3cr;et=x";
client.dns.lookup=use_all_dns_ips
session.timeout.ms : 45000
! a comment
acks all
ssl.endpoint.identification.algorithm=
key.serializer=org.apache.kafka.common.serialization.StringSerializer
"""


def test_java_properties_syntax():
    got = parse_properties("a=1\n  b : 2\nc 3\n# x=9\n! y=9\nd=line\\\n   continued\ne=tab\\tand\\u00e9\nf=\n"
                           "g=a=b\nh\\ i=sp\n")
    assert got == {"a": "1", "b": "2", "c": "3", "d": "linecontinued", "e": "tab\tand\u00e9", "f": "",
                   "g": "a=b", "h i": "sp"}


def test_client_properties_file_is_translated_to_librdkafka(tmp_path):
    f = tmp_path / "client.properties"
    f.write_text(CLIENT_PROPERTIES)
    cfg = build_client_config([f], ["session.timeout.ms=30000"])
    assert cfg.common == {
        "bootstrap.servers": "pkc-123.europe-west1.gcp.confluent.cloud:9092",
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.username": "APIKEY", "sasl.password": "s3cr;et=x",
        "session.timeout.ms": "30000",          # --config wins over the file
        "acks": "all", "ssl.endpoint.identification.algorithm": "none"}
    assert cfg.ignored == ("key.serializer", "client.dns.lookup")


def test_layers_common_then_kind_and_kinds_stay_apart():
    cfg = build_client_config([], ["security.protocol=SSL", "fetch.wait.max.ms=7"],
                              consumer_pairs=["fetch.wait.max.ms=9"], producer_pairs=["linger.ms=1"],
                              admin_pairs=["socket.timeout.ms=5000"])
    cluster = KafkaCluster("h:1", cfg)
    c = kafka.consumer_defaults(cluster)
    p = kafka.producer_defaults(cluster)
    assert (c["bootstrap.servers"], c["security.protocol"], c["fetch.wait.max.ms"]) == ("h:1", "SSL", "9")
    assert "linger.ms" not in c and "socket.timeout.ms" not in c
    assert (p["security.protocol"], p["linger.ms"], p["fetch.wait.max.ms"]) == ("SSL", "1", "7")
    assert cfg.for_kind("admin") == {"security.protocol": "SSL", "fetch.wait.max.ms": "7",
                                     "socket.timeout.ms": "5000"}
    # a programmatic per-kind dict layers over the same kind
    more = cfg.with_kind("consumer", {"isolation.level": "read_committed"})
    assert more.for_kind("consumer")["isolation.level"] == "read_committed"
    assert more.for_kind("consumer")["fetch.wait.max.ms"] == "9"
    assert pickle.loads(pickle.dumps(cluster)) == cluster          # travels to Spark executors
    assert str(cluster) == "h:1"


@pytest.mark.parametrize("pairs, message", [
    (["group.id=x"], "group.id is set by the processor"),
    (["enable.auto.commit=true"], "enable.auto.commit is set by the processor"),
    (["nothing"], "expected KEY=VALUE"),
])
def test_refusals_name_the_key(pairs, message):
    with pytest.raises(ConfigError, match=message):
        build_client_config([], pairs)


def test_java_only_security_without_librdkafka_equivalent_is_refused():
    with pytest.raises(ConfigError, match="JKS truststore is Java-only"):
        build_client_config([], ["ssl.truststore.location=/x.jks"])
    with pytest.raises(ConfigError, match="OAuthBearerLoginModule has no librdkafka equivalent"):
        build_client_config([], ["sasl.jaas.config=org.apache.kafka.common.security.oauthbearer."
                                 "OAuthBearerLoginModule required;"])
    cfg = build_client_config([], ["ssl.truststore.type=PEM", "ssl.truststore.location=/ca.pem"])
    assert cfg.common == {"ssl.ca.location": "/ca.pem"}


def test_secrets_never_printed(tmp_path):
    f = tmp_path / "client.properties"
    f.write_text(CLIENT_PROPERTIES)
    cfg = build_client_config([f], ["ssl.key.password=kp", "ssl.key.pem=PEMDATA",
                                    "sasl.oauthbearer.client.secret=cs"])
    text = cfg.describe() + repr(cfg) + repr(KafkaCluster("h:1", cfg))
    for secret in ("s3cr;et=x", "kp", "PEMDATA", "cs", "APIKEY"):   # (a cloud API key is the user name)
        assert secret not in text.replace("*****", ""), secret
    assert "sasl.username=*****" in text and "security.protocol=SASL_SSL" in text
    assert redacted({"sasl.password": "p", "acks": "all"}) == {"sasl.password": "*****", "acks": "all"}
    # librdkafka's refusal of a bad value names the key, never the secret
    with pytest.raises(ConfigError) as exc:
        kafka.new_producer({**kafka.producer_defaults("h:1"), "security.protocol": "SSL",
                            "ssl.key.pem": "hunter2"}, "a test")
    assert "ssl.key.pem" in str(exc.value) and "producer for a test" in str(exc.value)
    assert "hunter2" not in str(exc.value)
    # librdkafka echoes an invalid value; where that value is also a secret's, it is masked
    with pytest.raises(ConfigError) as exc:
        kafka.new_producer({**kafka.producer_defaults("h:1"), "security.protocol": "hunter2",
                            "sasl.password": "hunter2"}, "a test")
    assert 'Invalid value "*****" for configuration property "security.protocol"' in str(exc.value)
    # a bad KEY=VALUE shows the key only
    with pytest.raises(ConfigError) as exc:
        build_client_config([], ["sasl.password"])
    assert "expected KEY=VALUE" in str(exc.value)


def _args(argv, environ):
    parser = cli._parser()
    cli.apply_environment(parser, environ)
    return parser.parse_args(argv)


def test_every_flag_from_the_environment_and_the_command_line_wins():
    env = {"PROCESSOR_BOOTSTRAP_SERVERS": "env:9092", "PROCESSOR_APPLICATION_ID": "app",
           "PROCESSOR_STATE_DIR": "/s", "PROCESSOR_COMMIT_INTERVAL_MS": "250",
           "PROCESSOR_CONFIG": "security.protocol=SSL\nssl.ca.location=/ca.pem\n",
           "PROCESSOR_TOPOLOGY": "mod:topo", "PROCESSOR_PROCESSING_GUARANTEE": "exactly_once",
           "PROCESSOR_LOG_LEVEL": "DEBUG"}
    a = _args(["run"], env)
    assert (a.topology, a.bootstrap_servers, a.application_id, a.state_dir, a.commit_interval_ms,
            a.processing_guarantee, a.log_level) == ("mod:topo", "env:9092", "app", "/s", 250,
                                                     "exactly_once", "DEBUG")
    assert a.config == ["security.protocol=SSL", "ssl.ca.location=/ca.pem"]
    b = _args(["run", "other:t", "--bootstrap-servers", "cli:1", "--config", "security.protocol=SASL_SSL"], env)
    assert (b.topology, b.bootstrap_servers) == ("other:t", "cli:1")
    assert cli.client_config_from_args(b).common == {"security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem"}
    c = _args(["backfill"], {**env, "PROCESSOR_EMIT_OUTPUTS": "true", "PROCESSOR_FORCE": "0"})
    assert (c.emit_outputs, c.force, c.topology) == (True, False, "mod:topo")
    with pytest.raises(ConfigError, match="PROCESSOR_ON_ERROR='drop'"):
        _args(["run"], {**env, "PROCESSOR_ON_ERROR": "drop"})


def test_every_flag_has_an_environment_variable_named_after_it():
    names = set()
    parser = cli._parser()
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for sub in action.choices.values():
                names |= {cli.environment_variable(a) for a in sub._actions if a.dest != "help"}
    assert {"PROCESSOR_BOOTSTRAP_SERVERS", "PROCESSOR_CONFIG_FILE", "PROCESSOR_CONSUMER_CONFIG",
            "PROCESSOR_PRODUCER_CONFIG", "PROCESSOR_ADMIN_CONFIG", "PROCESSOR_ARCHIVE",
            "PROCESSOR_STARTUP_TIMEOUT_S", "PROCESSOR_TOPOLOGY"} <= names


def test_bootstrap_servers_from_the_config_file(tmp_path):
    f = tmp_path / "client.properties"
    f.write_text("bootstrap.servers=file:9092\nsecurity.protocol=SSL\n")
    a = _args(["run", "m:t", "--application-id", "a", "--state-dir", "/s", "--config-file", str(f)], {})
    cfg = cli.client_config_from_args(a)
    assert a.bootstrap_servers == "file:9092" and "bootstrap.servers" not in cfg.common
    b = _args(["run", "m:t", "--application-id", "a", "--state-dir", "/s", "--config-file", str(f),
               "--bootstrap-servers", "other:1"], {})
    with pytest.raises(ConfigError, match="differs from --bootstrap-servers"):
        cli.client_config_from_args(b)
    c = _args(["run", "m:t", "--application-id", "a", "--state-dir", "/s"], {})
    with pytest.raises(ConfigError, match="--bootstrap-servers is required"):
        cli.client_config_from_args(c)


# Every Kafka client of the product is opened through kafka.new_consumer / new_producer / admin
# (which layer the user's settings and log the role); a direct constructor would bypass them.
_DIRECT = re.compile(r"\b(Consumer|Producer|AdminClient)\(")


def test_no_client_is_opened_around_the_layered_settings():
    offenders = []
    for path in sorted([*ROOT.joinpath("processor").rglob("*.py"), *ROOT.joinpath("backfill").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _DIRECT.search(code) and "def " not in code and "_open(" not in code:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_every_helper_takes_a_cluster():
    cfg = ClientConfig(common={"security.protocol": "SSL"})
    cluster = kafka.cluster_of("h:1", cfg)
    assert kafka.cluster_of(cluster) is cluster
    assert kafka.consumer_defaults(cluster)["security.protocol"] == "SSL"
    assert kafka.producer_defaults(cluster)["security.protocol"] == "SSL"
    assert kafka.consumer_defaults("h:1").get("security.protocol") is None
