"""Secret settings: the redaction rule (``client_config.is_secret``) against librdkafka's own list of
sensitive settings and the Schema Registry client's setting names, not against a list of three.

librdkafka's list: every configuration name in the loaded library (its strings, each confirmed by
librdkafka accepting or refusing it as a setting, not as an unknown property), and of those the
ones its configuration dump (``debug=conf``) prints as ``[redacted]``."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaException, Producer

from processor.kafka.client_config import describe_registry, describe_settings, is_secret, redacted

# the Schema Registry client's settings that hold no secret (any other name the client's modules
# quote must be redacted: a new one fails this test until it is classified)
REGISTRY_NOT_SECRET = {
    "url", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.max.wait.ms", "retries.wait.ms",
    "ssl.ca.location", "ssl.certificate.location", "timeout", "proxy", "bearer.auth.credentials.source",
    "bearer.auth.identity.pool.id", "bearer.auth.logical.cluster", "bearer.auth.client.id",
    "bearer.auth.scope", "bearer.auth.issuer.endpoint.url", "bearer.auth.issuer.endpoint.query",
    "bearer.auth.custom.provider.function", "basic.auth.credentials.source",
}


def _librdkafka_path() -> Path:
    assert confluent_kafka.libversion()
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "librdkafka" in line:
            return Path(line.split()[-1])
    raise AssertionError("librdkafka is not loaded in this process")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def librdkafka_settings() -> tuple[set[str], set[str]]:
    """(every setting name librdkafka knows, those it redacts in its own configuration dump)."""
    data = _librdkafka_path().read_bytes()
    candidates = {m.decode() for m in re.findall(rb"(?<=\x00)[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+(?=\x00)", data)}
    known, sensitive = set(), set()
    for name in sorted(candidates):
        lines = _Lines()
        logger = logging.getLogger(f"test_secret_settings.{name}")
        logger.addHandler(lines)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        try:
            producer = Producer({"bootstrap.servers": "localhost:1", "debug": "conf", name: "x", "logger": logger})
        except KafkaException as exc:
            if "No such configuration property" not in str(exc):
                known.add(name)   # a setting refusing the value "x" (a number, a flag, a choice): no secret
            continue
        except (TypeError, ValueError):   # the Python client's own typed settings
            known.add(name)
            continue
        producer.poll(0)
        known.add(name)
        if any(line.endswith(f" {name} = [redacted]") for line in lines.lines):
            sensitive.add(name)
        del producer
    return known, sensitive


def registry_settings() -> set[str]:
    """The setting names the Schema Registry client's modules quote."""
    root = Path(confluent_kafka.__file__).parent / "schema_registry"
    names: set[str] = set()
    for path in [*root.glob("*/schema_registry_client.py"), *root.glob("**/*.py")]:
        text = path.read_text()
        quoted = set(re.findall(r"['\"]([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)['\"]", text))
        if path.name == "schema_registry_client.py":
            names |= {n for n in quoted if not n.endswith("_pb2")}
        else:
            names |= {n for n in quoted if n.startswith(("bearer.auth.", "basic.auth."))}
    return names | {"url", "timeout", "proxy"}


def test_every_setting_librdkafka_redacts_is_a_secret_here():
    known, sensitive = librdkafka_settings()
    assert len(known) > 150, sorted(known)   # the enumeration found librdkafka's settings
    assert {"sasl.password", "ssl.key.password", "sasl.oauthbearer.config",
            "sasl.oauthbearer.assertion.private.key.passphrase"} <= sensitive
    assert sorted(n for n in sensitive if not is_secret(n)) == []
    # and no ordinary setting is hidden by the rule: every redacted one is sensitive, or names a
    # secret by a part librdkafka does not flag (a JAAS text, a Kerberos keytab's principal is not)
    over = sorted(n for n in known - sensitive if is_secret(n))
    assert over == ["sasl.jaas.config",   # Java's login text, with the password in it (translated here)
                    "sasl.oauthbearer.client.credentials.client.secret"], over   # an alias of client.secret


def test_every_secret_of_the_registry_client_is_a_secret_here():
    names = registry_settings()
    assert {"basic.auth.user.info", "bearer.auth.token", "ssl.key.password", "bearer.auth.client.secret"} <= names
    unclassified = sorted(n for n in names if not is_secret(n) and n not in REGISTRY_NOT_SECRET)
    assert unclassified == []
    assert sorted(n for n in REGISTRY_NOT_SECRET if is_secret(n)) == []


def test_secret_values_never_reach_a_described_line():
    known, sensitive = librdkafka_settings()
    settings = {name: f"S3CRET-{i}" for i, name in enumerate(sorted(sensitive))}
    settings["sasl.jaas.config"] = "org.apache.kafka.common.security.plain.PlainLoginModule required " \
                                   "password='S3CRET-j';"
    settings["acks"] = "all"
    line = describe_settings(settings)
    assert "S3CRET" not in line and "acks=all" in line
    assert redacted(settings)["acks"] == "all"
    registry = {n: f"S3CRET-r{i}" for i, n in enumerate(sorted(registry_settings() - REGISTRY_NOT_SECRET))}
    registry["url"] = "https://key:S3CRET-u@registry:8081"
    line = describe_registry(registry)
    assert "S3CRET" not in line and "https://*****@registry:8081" in line


def test_the_copy_check_s_admin_client_logs_no_secret(caplog):
    """kafka-python's admin client logs its configuration at DEBUG: the start-up copy check
    (``membership.live_claims``) keeps that line out (a closed port: the client gives up)."""
    import socket

    import pytest

    from processor.runtime.membership import live_claims
    from processor.runtime.membership_settings import kafka_python_settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options, _ = kafka_python_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                        "sasl.username": "S3CRET-user", "sasl.password": "S3CRET-pass",
                                        "request.timeout.ms": "20000"})
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as exc:
        live_claims(f"127.0.0.1:{port}", "g", "w1", options, timeout_s=1.0)
    assert not isinstance(exc.value, TypeError)   # (request.timeout.ms is the copy check's own)
    assert caplog.records and not any("S3CRET" in r.getMessage() for r in caplog.records)
