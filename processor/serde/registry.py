"""Avro with a Confluent Schema Registry: ``Serdes.avro(schema, registry=url_or_client)``.

Built on ``confluent_kafka.schema_registry`` (``AvroSerializer`` / ``AvroDeserializer``), with
the topic's ``SerializationContext`` and the default ``TopicNameStrategy`` (subject
``<topic>-key`` / ``<topic>-value``):

- **reading**: the writer's schema is resolved by the id in each record's Confluent frame
  (``{0x00}{4-byte BE schema id}{body}``), then the record is read into the serde's own schema
  (the reader schema, e.g. ``schemas/order.avsc``) by Avro schema resolution. A producer that
  moves to a compatible v2 (a field added with a default, a field removed) keeps flowing; a
  record whose writer schema cannot be resolved into the reader schema, or whose schema id the
  registry does not know, fails to deserialize with the reason (the task then follows
  ``--on-error``). Reading never registers anything.
- **writing**: the serde's schema under the topic's subject. Auto-registration is configurable
  (``auto_register=``, or ``auto.register.schemas`` in the host's registry settings; default
  on, Confluent's default); with it off, a schema not registered under the subject is an
  output error naming the subject.

Topic binding: a registry serde needs its topic (the subject is derived from it), so the
serde returned by ``Serdes.avro(..., registry=...)`` is *unbound*; ``for_topic(topic, is_key,
config)`` returns a copy bound to one topic, with the host's registry settings (``config``:
``--schema-registry-url``, ``--schema-registry-config``, the ``schema.registry.*`` keys of
``--config`` / ``--config-file``) layered over the serde's own. The ``Topology`` binds its
sources and sinks to their topics and its stores to their changelog topics
(``Topology.for_application``); an unbound registry serde refuses to (de)serialize, so nothing
silently uses the wrong subject or the wrong registry.

Transient failures are not bad records (issue 47): when the registry cannot be used at all
(unreachable, a request timing out, HTTP 5xx or 408, 429, or 401/403: the credentials refused), a
(de)serialization does not fail the record: it waits the failure out, retrying with exponential
back-off (0.5 s doubling to 5 s) for up to ``outage.timeout.ms`` (default 60000; a host registry
setting: ``--schema-registry-config outage.timeout.ms=...`` or ``schema.registry.outage.timeout.ms``
in ``--config``), counting each retry per kind (``retry_counts``: the worker's
``processor_registry_retries_total{kind}``) and logging one warning per kind and outage. Past the
bound it raises ``SchemaRegistryUnavailable`` (exit code 8), which is not a record error: the
worker stops without committing past the record, the backfill fails. Only what the registry
answers about the data itself is the record's: an unknown schema id (404), a writer schema that
does not resolve into the reader's, bytes that are no frame or no Avro. The bound is measured from
the first failure; the call in flight when it passes finishes first (its request ``timeout``:
10 s unless set, where the client library has none). The client library's own retries
(``max.retries``, its default 3 with random waits of up to 1, 2, 4 s) are off unless set: the
serde's are the one layer, counted and bounded.

Clients are made lazily, once per process per settings (``client_for``): a serde pickles by its
settings (Spark executors reconnect), never by a client object. ``mock://`` URLs give the
client library's in-memory registry, which lives in one process: every serde of this process
with the same ``mock://`` settings shares it, another process has its own (empty) one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from processor.errors import ConfigError, SchemaRegistryUnavailable
from processor.serde import Serde, load_schema

__all__ = ["RegistryAvroSerde", "client_for", "adopt_client", "SERDE_SETTINGS", "split_settings",
           "failure_kind", "retry_counts", "DEFAULT_OUTAGE_TIMEOUT_MS", "DEFAULT_REQUEST_TIMEOUT_S"]

log = logging.getLogger("processor.serde.registry")

# settings of the serde (not of the registry client) that may come through the host's registry
# configuration
SERDE_SETTINGS = ("auto.register.schemas", "normalize.schemas", "outage.timeout.ms")

# how long one (de)serialization waits out a registry that cannot be used before the host stops
DEFAULT_OUTAGE_TIMEOUT_MS = 60_000
# the registry client's request timeout where the settings give none (the client library's
# default is none at all: a registry that accepts a connection and never answers would hang
# the worker past any bound); and its own retries are off where the settings do not ask for them
DEFAULT_REQUEST_TIMEOUT_S = 10
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0

# the kinds of failure waited out (``failure_kind``), the label of the retry counter
KINDS = ("unreachable", "timeout", "unavailable", "throttled", "unauthorized")
_retries: dict[str, int] = dict.fromkeys(KINDS, 0)
_warned: set[str] = set()
_retry_lock = threading.Lock()

_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def _settings_key(conf: dict) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in conf.items()))


def client_for(conf: dict) -> Any:
    """The process's Schema Registry client for ``conf``, made once and shared.

    ``conf`` is ``{"url": ...}`` plus the client library's settings (``basic.auth.user.info``,
    ``ssl.ca.location``, ...); every serde with the same settings shares the client. ``mock://``
    URLs give the in-memory registry.
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = _settings_key(conf)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            settings = dict(conf)
            if not str(settings.get("url", "")).startswith("mock://"):
                settings.setdefault("timeout", DEFAULT_REQUEST_TIMEOUT_S)
                # one layer of retries, the serde's (counted, bounded by outage.timeout.ms), unless
                # the settings ask for the client library's own as well
                settings.setdefault("max.retries", 0)
            client = _clients[key] = SchemaRegistryClient.new_client(settings)
        return client


def failure_kind(exc: BaseException) -> str | None:
    """The kind of ``exc`` when it says the registry cannot be used now, else None.

    ``unreachable`` (no answer: connection refused or reset, DNS, TLS: the HTTP client's
    transport errors), ``timeout`` (its timeouts), ``unavailable`` (HTTP 5xx, 408),
    ``throttled`` (429), ``unauthorized`` (401, 403, an OAuth token that cannot be fetched).
    None: anything else, e.g. a 404 (unknown schema id, subject or version), 409 (incompatible)
    or 422 (invalid schema), the registry's answer about the data.
    """
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 4:
        seen += 1
        names = {c.__name__ for c in type(e).__mro__ if c.__module__.split(".")[0] in ("httpx", "httpx2")}
        if "TimeoutException" in names:
            return "timeout"
        if "TransportError" in names:
            return "unreachable"
        status = getattr(e, "http_status_code", None)
        if type(e).__name__ == "SchemaRegistryError" and isinstance(status, int):
            if status in (401, 403):
                return "unauthorized"
            if status == 429:
                return "throttled"
            if status == 408 or status >= 500:
                return "unavailable"
            return None
        if type(e).__name__ == "OAuthTokenError":
            return "unauthorized"
        e = e.__cause__
    return None


def retry_counts() -> dict[str, int]:
    """Per kind of failure (``failure_kind``), the registry calls retried in this process.

    A process-wide counter (every serde, every client): each call that failed and was tried again.
    """
    with _retry_lock:
        return dict(_retries)


def _count_retry(kind: str, url: str, exc: BaseException, what: Callable[[], str]) -> None:
    """One retry of ``kind``: counted; logged if the first of its kind since the registry answered.

    One warning per kind and outage, not one per record.
    """
    with _retry_lock:
        _retries[kind] = _retries.get(kind, 0) + 1
        first = kind not in _warned
        _warned.add(kind)
    if first:
        log.warning("the Schema Registry at %s cannot be used (%s: %s) while %s: retrying with back-off "
                    "(the record waits; past outage.timeout.ms the worker stops, the backfill fails)",
                    url, kind, _describe_failure(exc), what())


def _recovered(url: str, retried: int, waited_s: float) -> None:
    with _retry_lock:
        was = sorted(_warned)
        _warned.clear()
    if was:
        log.warning("the Schema Registry at %s answers again (after %d retries, %.1f s; was: %s)",
                    url, retried, waited_s, ", ".join(was))


def _describe_failure(exc: BaseException) -> str:
    if type(exc).__name__ == "SchemaRegistryError":
        return f"HTTP {getattr(exc, 'http_status_code', '?')}: {getattr(exc, 'error_message', exc)}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _millis(value: object, name: str) -> int:
    try:
        ms = int(str(value).strip())
    except ValueError:
        ms = -1
    if ms < 0:
        raise ConfigError(f"{name} must be a whole number of milliseconds (0 or more), not {value!r}")
    return ms


def adopt_client(client: Any) -> dict:
    """Makes ``client`` the process's client for its settings; returns the settings.

    So a serde unpickled in this process finds the very same one, e.g. a ``mock://`` registry.
    """
    conf = dict(client.config())
    with _clients_lock:
        _clients.setdefault(_settings_key(conf), client)
    return conf


def split_settings(settings: dict) -> tuple[dict, dict]:
    """Host registry settings -> (client settings, serde settings)."""
    client = {k: v for k, v in settings.items() if k not in SERDE_SETTINGS}
    serde = {k: v for k, v in settings.items() if k in SERDE_SETTINGS}
    return client, serde


def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def safe_url(url: str) -> str:
    """``url`` without user info (``https://key:secret@host`` -> ``https://*****@host``)."""
    parts = []
    for one in str(url).split(","):
        s = urlsplit(one.strip())
        if s.username or s.password:
            host = s.hostname or ""
            if s.port:
                host = f"{host}:{s.port}"
            one = urlunsplit((s.scheme, f"*****@{host}", s.path, s.query, s.fragment))
        parts.append(one.strip())
    return ",".join(parts)


class RegistryAvroSerde(Serde):
    """Avro in Confluent wire format with schemas in a Schema Registry (Confluent's ``KafkaAvroSerde``).

    See the module docstring. ``schema``: the reader/writer schema, as for ``Serdes.avro``
    (dict, path, or a name in ``schemas/``). ``registry``: a URL (``http(s)://...``,
    ``mock://...``), a dict of client settings (``{"url": ..., "basic.auth.user.info": ...}``),
    or a ``SchemaRegistryClient``. ``auto_register``: whether writing registers the schema
    under the topic's subject (None: the host's ``auto.register.schemas``, else True).
    """

    name = "avro"

    def __init__(self, schema: Any, registry: Any, auto_register: bool | None = None, *,
                 _bound: dict | None = None):
        if _bound is not None:          # a copy bound to a topic (for_topic)
            self.__dict__.update(_bound)
            self._reset()
            return
        self.raw_schema = load_schema(schema)
        serde_settings: dict
        if isinstance(registry, str):
            conf, serde_settings = {"url": registry}, {}
        elif isinstance(registry, dict):
            conf = dict(registry)
            serde_settings = {k: conf.pop(k) for k in ("outage.timeout.ms",) if k in conf}
            if "url" not in conf:
                raise ValueError("a Schema Registry settings dict needs a 'url'")
        elif hasattr(registry, "config") and callable(registry.config):
            conf = adopt_client(registry)
            serde_settings = {}
        else:
            raise TypeError(f"registry must be a URL, a dict of Schema Registry client settings or a "
                            f"SchemaRegistryClient, not {type(registry).__name__}")
        self.conf = conf
        self.auto_register = auto_register
        self.normalize = False
        self.outage_timeout_ms = (_millis(serde_settings["outage.timeout.ms"], "outage.timeout.ms")
                                  if "outage.timeout.ms" in serde_settings else DEFAULT_OUTAGE_TIMEOUT_MS)
        self.topic: str | None = None
        self.is_key = False
        self._reset()

    def _reset(self) -> None:
        self._serializer: Any = None
        self._deserializer: Any = None
        self._ctx: Any = None

    # -- binding ----------------------------------------------------------------------------------
    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> RegistryAvroSerde:
        """A copy bound to the subject ``<topic>-key`` or ``<topic>-value``, with the host's settings.

        Args:
            topic: The topic.
            is_key: For the topic's keys (else its values).
            config: The host's Schema Registry settings (client settings, and
                ``auto.register.schemas``/``normalize.schemas``/``outage.timeout.ms``).

        Returns:
            This serde when nothing changes, else the bound copy.
        """
        client_settings, serde_settings = split_settings(config or {})
        conf = {**self.conf, **client_settings}
        auto = self.auto_register
        if auto is None and "auto.register.schemas" in serde_settings:
            auto = _flag(serde_settings["auto.register.schemas"], "auto.register.schemas")
        normalize = (_flag(serde_settings["normalize.schemas"], "normalize.schemas")
                     if "normalize.schemas" in serde_settings else self.normalize)
        outage = (_millis(serde_settings["outage.timeout.ms"], "outage.timeout.ms")
                  if "outage.timeout.ms" in serde_settings else self.outage_timeout_ms)
        if (topic, is_key, conf, auto, normalize, outage) == (self.topic, self.is_key, self.conf,
                                                              self.auto_register, self.normalize,
                                                              self.outage_timeout_ms):
            return self
        state = {**self.__getstate__(), "topic": topic, "is_key": is_key, "conf": conf,
                 "auto_register": auto, "normalize": normalize, "outage_timeout_ms": outage}
        return RegistryAvroSerde(None, None, _bound=state)

    def check_settings(self) -> None:
        """Makes the registry client now (no request is sent).

        Settings it refuses are a configuration error at start, not a failure of every record.

        Raises:
            ConfigError: The client library refuses the settings.
        """
        try:
            client_for(self.conf)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"Schema Registry settings of {self!r}: {exc}") from None

    @property
    def subject(self) -> str | None:
        """The subject the serde is bound to (``<topic>-key``/``<topic>-value``), or None."""
        return None if self.topic is None else f"{self.topic}-{'key' if self.is_key else 'value'}"

    def _unbound(self, what: str) -> ValueError:
        return ValueError(f"{self!r} is bound to no topic, so it cannot {what}: a Schema Registry serde "
                          f"is bound to a topic by the topology (sources, sinks, table sources); it "
                          f"cannot serve as the serde of operator state (aggregates, joins)")

    def _context(self) -> Any:
        if self._ctx is None:
            from confluent_kafka.serialization import MessageField, SerializationContext

            self._ctx = SerializationContext(cast(str, self.topic),
                                             MessageField.KEY if self.is_key else MessageField.VALUE)
        return self._ctx

    def _schema_str(self) -> str:
        return json.dumps(self.raw_schema)

    # -- the serde ----------------------------------------------------------------------------------
    def serialize(self, value: Any) -> bytes | None:
        """The framed Avro bytes of ``value``, registering its schema when allowed; None stays None.

        A registry that cannot be used is waited out (``outage.timeout.ms``), then
        ``SchemaRegistryUnavailable``: not an output error (the input record is not rejected).
        """
        if value is None:
            return None
        ser = self._serializer
        if ser is None:
            if self.topic is None:
                raise self._unbound("serialize")
            from confluent_kafka.schema_registry.avro import AvroSerializer

            auto = True if self.auto_register is None else self.auto_register
            ser = self._serializer = AvroSerializer(
                client_for(self.conf), self._schema_str(),
                conf={"auto.register.schemas": auto, "normalize.schemas": self.normalize})
        try:
            return ser(value, self._context())
        except Exception as exc:
            if failure_kind(exc) is None:
                raise self._write_failure(exc) from exc
            first = exc
        try:
            return self._wait_out(lambda: ser(value, self._context()), first, self._writing)
        except SchemaRegistryUnavailable:
            raise
        except Exception as exc:
            raise self._write_failure(exc) from exc

    def _write_failure(self, exc: Exception) -> Exception:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if isinstance(exc, SchemaRegistryError):
            how = ("registering it failed" if self.auto_register is not False
                   else "it is not registered there and auto-registration is off for this output")
            return ValueError(f"schema {self._record_name()} under subject {self.subject!r} at "
                              f"{safe_url(self.conf['url'])}: {how} ({exc.error_message})")
        return exc

    def _writing(self) -> str:
        how = "registering" if self.auto_register is not False else "looking up"
        return f"{how} schema {self._record_name()} under subject {self.subject!r}"

    def deserialize(self, data: bytes | None) -> Any:
        """The record of framed Avro bytes, read from its writer's schema into ours; None stays None.

        A registry that cannot be used is waited out (``outage.timeout.ms``), then
        ``SchemaRegistryUnavailable``: not a deserialization error (the record is not rejected).
        """
        if data is None:
            return None
        de = self._deserializer
        if de is None:
            if self.topic is None:
                raise self._unbound("deserialize")
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            de = self._deserializer = AvroDeserializer(client_for(self.conf), self._schema_str())
        try:
            return de(data, self._context())
        except Exception as exc:
            if failure_kind(exc) is None:
                raise ValueError(self._read_failure(data, exc)) from exc
            first = exc
        try:
            return self._wait_out(lambda: de(data, self._context()), first, lambda: self._reading(data))
        except SchemaRegistryUnavailable:
            raise
        except Exception as exc:
            raise ValueError(self._read_failure(data, exc)) from exc

    def _reading(self, data: bytes) -> str:
        sid = int.from_bytes(data[1:5], "big") if len(data) >= 5 and data[0] == 0 else None
        writer = f"writer schema id {sid}" if sid is not None else "the writer schema"
        return f"reading {writer} of a record of topic {self.topic!r} ({'key' if self.is_key else 'value'})"

    def _wait_out(self, call: Callable[[], Any], exc: Exception, what: Callable[[], str]) -> Any:
        """``call`` again, with exponential back-off, while the registry cannot be used.

        While it fails so (``failure_kind``), for up to ``outage_timeout_ms`` from ``exc``, the
        first failure; then ``SchemaRegistryUnavailable``. Anything else it raises is raised as
        is (the registry answered about the data).
        """
        started = time.monotonic()
        deadline = started + self.outage_timeout_ms / 1000
        delay = FIRST_BACKOFF_S
        url = safe_url(self.conf["url"])
        kind = cast(str, failure_kind(exc))
        retried = 0
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise SchemaRegistryUnavailable(
                    f"the Schema Registry at {url} could not be used for {now - started:.1f} s "
                    f"(outage.timeout.ms={self.outage_timeout_ms}, {retried} retries): {what()}: "
                    f"{kind}, {_describe_failure(exc)}; stopping without committing the record "
                    f"(it is read again after a restart)") from exc
            _count_retry(kind, url, exc, what)
            retried += 1
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, MAX_BACKOFF_S)
            try:
                result = call()
            except Exception as again:
                again_kind = failure_kind(again)
                if again_kind is None:
                    raise
                exc, kind = again, again_kind
                continue
            _recovered(url, retried, time.monotonic() - started)
            return result

    def _read_failure(self, data: bytes, exc: Exception) -> str:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if len(data) < 5 or data[0] not in (0, 1):
            return (f"not a Schema Registry frame ({len(data)} bytes, magic byte "
                    f"{data[0] if data else None}): {type(exc).__name__}: {exc}")
        sid = int.from_bytes(data[1:5], "big") if data[0] == 0 else None
        writer = f"writer schema id {sid}" if sid is not None else "writer schema (by GUID)"
        where = safe_url(self.conf["url"])
        if isinstance(exc, SchemaRegistryError):
            if exc.http_status_code == 404:
                return f"{writer} not found in the registry at {where}: {exc.error_message}"
            return (f"{writer}: the registry at {where} answered HTTP {exc.http_status_code} "
                    f"(error code {exc.error_code}): {exc.error_message}")
        if type(exc).__name__ == "SchemaResolutionError":
            return (f"{writer} cannot be read into the reader schema {self._record_name()} "
                    f"(incompatible change): {exc}")
        return f"{writer}: {type(exc).__name__}: {exc}"

    def _record_name(self) -> str:
        s = self.raw_schema
        if isinstance(s, dict) and s.get("name"):
            return f"{s['namespace']}.{s['name']}" if s.get("namespace") and "." not in s["name"] else s["name"]
        return repr(s)

    # -- identity, pickling -----------------------------------------------------------------------
    def _identity(self) -> tuple:
        return (json.dumps(self.raw_schema, sort_keys=True), _settings_key(self.conf), self.auto_register,
                self.normalize, self.topic, self.is_key, self.outage_timeout_ms)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_serializer", "_deserializer", "_ctx")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("outage_timeout_ms", DEFAULT_OUTAGE_TIMEOUT_MS)
        self._reset()

    def __repr__(self) -> str:
        name = self.raw_schema.get("name", "?") if isinstance(self.raw_schema, dict) else "?"
        bound = f", topic={self.topic!r}" if self.topic is not None else ""
        return f"Serdes.avro({name!r}, registry={safe_url(self.conf['url'])!r}{bound})"
