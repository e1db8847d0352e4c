"""The user's consumer settings (librdkafka's names) as kafka-python's options, for the group
membership client (``processor/runtime/membership.py``): each setting translated, or named in a
log line when kafka-python cannot take it (never dropped silently); settings with no bearing on
membership are left to the data clients."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# librdkafka setting -> kafka-python's: the user's client settings reach the membership client too
_KAFKA_PYTHON_SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "security.protocol": ("security_protocol", str.upper),
    "ssl.ca.location": ("ssl_cafile", str),
    "ssl.certificate.location": ("ssl_certfile", str),
    "ssl.key.location": ("ssl_keyfile", str),
    "ssl.key.password": ("ssl_password", str),
    "sasl.mechanism": ("sasl_mechanism", str.upper),
    "sasl.mechanisms": ("sasl_mechanism", str.upper),
    "sasl.username": ("sasl_plain_username", str),
    "sasl.password": ("sasl_plain_password", str),
    "client.id": ("client_id", str),
    "session.timeout.ms": ("session_timeout_ms", int),
    "heartbeat.interval.ms": ("heartbeat_interval_ms", int),
    "max.poll.interval.ms": ("max_poll_interval_ms", int),
    "group.instance.id": ("group_instance_id", str),
    "request.timeout.ms": ("request_timeout_ms", int),
    "reconnect.backoff.ms": ("reconnect_backoff_ms", int),
    "reconnect.backoff.max.ms": ("reconnect_backoff_max_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "enable.ssl.certificate.verification": ("ssl_check_hostname", lambda v: str(v).lower() == "true"),
}
# librdkafka settings with no bearing on group membership (or handled by the data clients only)
_NOT_FOR_MEMBERSHIP = ("bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset",
                       "isolation.level", "enable.partition.eof", "fetch.", "queued.", "socket.",
                       "statistics.", "debug", "log", "partition.assignment.strategy", "api.version",
                       "broker.version", "topic.metadata", "client.dns.lookup", "enable.auto.offset.store",
                       "check.crcs", "error_cb", "logger", "on_commit", "stats_cb", "throttle_cb")


def kafka_python_settings(conf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The consumer settings (librdkafka's names) as kafka-python options, and the names of
    settings that matter to a connection but kafka-python cannot take (to be named in a log
    line, never dropped silently)."""
    out: dict[str, Any] = {}
    unsupported = []
    for k, v in conf.items():
        if k in _KAFKA_PYTHON_SETTINGS:
            name, convert = _KAFKA_PYTHON_SETTINGS[k]
            out[name] = convert(v)
        elif not any(k == p or (p.endswith(".") and k.startswith(p)) for p in _NOT_FOR_MEMBERSHIP):
            unsupported.append(k)
    if out.get("security_protocol", "PLAINTEXT") in ("SSL", "SASL_SSL") and "ssl_cafile" in out:
        out.setdefault("ssl_check_hostname", True)
    return out, sorted(unsupported)
