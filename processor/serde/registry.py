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

Clients are made lazily, once per process per settings (``client_for``): a serde pickles by its
settings (Spark executors reconnect), never by a client object. ``mock://`` URLs give the
client library's in-memory registry, which lives in one process: every serde of this process
with the same ``mock://`` settings shares it, another process has its own (empty) one.
"""

from __future__ import annotations

import json
import threading
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from processor.errors import ConfigError
from processor.serde import Serde, load_schema

__all__ = ["RegistryAvroSerde", "client_for", "adopt_client", "SERDE_SETTINGS", "split_settings"]

# settings of the serde (not of the registry client) that may come through the host's registry
# configuration
SERDE_SETTINGS = ("auto.register.schemas", "normalize.schemas")

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
            client = _clients[key] = SchemaRegistryClient.new_client(dict(conf))
        return client


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
        if isinstance(registry, str):
            conf = {"url": registry}
        elif isinstance(registry, dict):
            conf = dict(registry)
            if "url" not in conf:
                raise ValueError("a Schema Registry settings dict needs a 'url'")
        elif hasattr(registry, "config") and callable(registry.config):
            conf = adopt_client(registry)
        else:
            raise TypeError(f"registry must be a URL, a dict of Schema Registry client settings or a "
                            f"SchemaRegistryClient, not {type(registry).__name__}")
        self.conf = conf
        self.auto_register = auto_register
        self.normalize = False
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
                ``auto.register.schemas``/``normalize.schemas``).

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
        if (topic, is_key, conf, auto, normalize) == (self.topic, self.is_key, self.conf,
                                                      self.auto_register, self.normalize):
            return self
        state = {**self.__getstate__(), "topic": topic, "is_key": is_key, "conf": conf,
                 "auto_register": auto, "normalize": normalize}
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

    # -- the serde --------------------------------------------------------------------------------
    def serialize(self, value: Any) -> bytes | None:
        """The framed Avro bytes of ``value``, registering its schema when allowed; None stays None."""
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
            from confluent_kafka.schema_registry.error import SchemaRegistryError

            if isinstance(exc, SchemaRegistryError):
                how = ("registering it failed" if self.auto_register is not False
                       else "it is not registered there and auto-registration is off for this output")
                raise ValueError(f"schema {self._record_name()} under subject {self.subject!r} at "
                                 f"{safe_url(self.conf['url'])}: {how} ({exc.error_message})") from exc
            raise

    def deserialize(self, data: bytes | None) -> Any:
        """The record of framed Avro bytes, read from its writer's schema into ours; None stays None."""
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
            raise ValueError(self._read_failure(data, exc)) from exc

    def _read_failure(self, data: bytes, exc: Exception) -> str:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if len(data) < 5 or data[0] not in (0, 1):
            return (f"not a Schema Registry frame ({len(data)} bytes, magic byte "
                    f"{data[0] if data else None}): {type(exc).__name__}: {exc}")
        sid = int.from_bytes(data[1:5], "big") if data[0] == 0 else None
        writer = f"writer schema id {sid}" if sid is not None else "writer schema (by GUID)"
        where = safe_url(self.conf["url"])
        if isinstance(exc, SchemaRegistryError):
            return f"{writer} not found in the registry at {where}: {exc.error_message}"
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
                self.normalize, self.topic, self.is_key)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_serializer", "_deserializer", "_ctx")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        name = self.raw_schema.get("name", "?") if isinstance(self.raw_schema, dict) else "?"
        bound = f", topic={self.topic!r}" if self.topic is not None else ""
        return f"Serdes.avro({name!r}, registry={safe_url(self.conf['url'])!r}{bound})"
