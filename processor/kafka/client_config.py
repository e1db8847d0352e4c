"""One Kafka client configuration for every connection a host opens.

The worker and the backfill (driver and executors) open several kinds of client: the group
consumer, restore, snapshot, probe and history-reading consumers, the output and changelog
producers, admin clients. A user's settings (security above all: a secured cluster refuses a
client that lacks them) must reach every one of them. Invariant: every client is built from
``kafka.consumer_defaults`` / ``kafka.producer_defaults`` / ``kafka.admin`` of a
``KafkaCluster``, which layers, each over the one before:

1. the role's built-in defaults (``processor.kafka.clients``);
2. common settings: ``--config-file PATH`` (Java ``.properties``, as ``client.properties`` files
   are written), then each ``--config KEY=VALUE``;
3. per client kind: ``--consumer-config``, ``--producer-config``, ``--admin-config``;
4. what a role cannot work without (a probe's own ``group.id``, partition EOF ...), set where
   the client is opened.

Schema Registry settings travel beside them, in their own layer (``ClientConfig.registry``: the
settings of ``confluent_kafka.schema_registry.SchemaRegistryClient`` and of the registry serdes,
``processor/serde/registry.py``): ``--schema-registry-url``, ``--schema-registry-config
KEY=VALUE``, and the registry keys of the common settings (``schema.registry.url``,
``schema.registry.<key>``, Java's ``basic.auth.user.info`` / ``basic.auth.credentials.source``,
``auto.register.schemas``), so one Confluent ``client.properties`` file configures both.

Settings the processor owns (``OWNED``) are refused with the flag that sets them instead.
Java-only keys of a ``client.properties`` file are translated where librdkafka has an
equivalent (``sasl.jaas.config`` of the PLAIN and SCRAM login modules -> ``sasl.username`` /
``sasl.password``; a PEM truststore -> ``ssl.ca.location``), ignored where they configure
something else (serializers, DNS lookup), and refused otherwise only by
librdkafka itself, naming the key. Secrets (``is_secret``) never appear in logs, errors or
``describe``: ``redacted`` replaces their values.

No confluent_kafka import here: the settings are plain data (they travel to Spark executors).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from processor.errors import ConfigError

KINDS = ("consumer", "producer", "admin")

# settings the processor sets itself, and what the user sets instead
OWNED = {
    "group.id": "the group is the application id (--application-id)",
    "transactional.id": "derived from the application id (--processing-guarantee exactly_once)",
    "enable.auto.commit": "offsets are committed with the state (at commit time, by the worker)",
    "enable.auto.offset.store": "offsets are committed with the state (at commit time, by the worker)",
    "enable.partition.eof": "the processor finds partition ends by EOF events",
    "logger": "librdkafka's log goes to Python logging ('processor.kafka')",
}

# keys of Java client.properties files that configure something other than the Kafka client
# (serializers, Schema Registry, the JVM's DNS lookup): ignored, named in the log
JAVA_ONLY_IGNORED = ("key.serializer", "value.serializer", "key.deserializer", "value.deserializer",
                     "client.dns.lookup", "schema.registry.url", "basic.auth.credentials.source",
                     "basic.auth.user.info", "schema.registry.basic.auth.user.info",
                     "auto.register.schemas", "use.latest.version")

# what a setting's name says when its value is a secret, or names one (a private key's file): every
# setting librdkafka itself redacts in its configuration dump (``sasl.username`` too: a cloud API
# key), the Schema Registry client's credentials, Java's JAAS text. ``tests/unit/test_secret_settings.py``
# checks the rule against librdkafka's own list of sensitive settings and the registry client's names.
_SECRET_PARTS = ("password", "passphrase", "secret", "jaas", "user.info", "username", "private",
                 "oauthbearer.config", "custom.provider.config")
_SECRET_ENDINGS = (".key", ".token", "key.pem", "key.location", "ssl.ca.pem")

# keys of the common settings that configure the Schema Registry: Java's name -> the Python
# client's (None: dropped, the Python client infers it); ``schema.registry.<key>`` -> ``<key>``
_REGISTRY_KEYS = {"schema.registry.url": "url", "basic.auth.user.info": "basic.auth.user.info",
                  "auto.register.schemas": "auto.register.schemas",
                  "normalize.schemas": "normalize.schemas", "basic.auth.credentials.source": None}
_REGISTRY_PREFIX = "schema.registry."


def is_secret(key: str) -> bool:
    """Whether the value of ``key`` is a secret (passwords, keys, JAAS configs, tokens)."""
    k = key.lower()
    return any(p in k for p in _SECRET_PARTS) or k.endswith(_SECRET_ENDINGS)


def redacted(settings: dict) -> dict:
    """``settings`` with every secret value replaced by ``*****``."""
    return {k: ("*****" if is_secret(k) else v) for k, v in settings.items()}


def describe_settings(settings: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(redacted(settings).items())) or "(none)"


def describe_registry(settings: dict) -> str:
    """Schema Registry settings in one line: secrets redacted, user info cut from the URL."""
    from processor.serde.registry import safe_url

    shown = redacted(settings)
    if "url" in shown:
        shown["url"] = safe_url(shown["url"])
    return describe_settings(shown)


def split_registry_settings(settings: dict) -> tuple[dict, dict]:
    """Common settings -> (Kafka client settings, Schema Registry settings)."""
    kafka, registry = {}, {}
    for key, value in settings.items():
        if key in _REGISTRY_KEYS:
            target = _REGISTRY_KEYS[key]
            if target is None:       # basic.auth.credentials.source
                if str(value).strip().upper() not in ("USER_INFO", "URL"):
                    raise ConfigError(f"basic.auth.credentials.source={value}: only USER_INFO "
                                      f"(basic.auth.user.info) and URL (user info in the URL) exist here")
                continue
            registry[target] = value
        elif key.startswith(_REGISTRY_PREFIX):
            registry[key[len(_REGISTRY_PREFIX):]] = value
        else:
            kafka[key] = value
    return kafka, registry


@dataclass(frozen=True)
class ClientConfig:
    """User settings: ``common`` for every client, then per kind (``consumer``, ``producer``,
    ``admin``). Plain string dicts; picklable."""

    common: dict = field(default_factory=dict)
    consumer: dict = field(default_factory=dict)
    producer: dict = field(default_factory=dict)
    admin: dict = field(default_factory=dict)
    ignored: tuple = ()          # Java-only keys dropped (names only)
    # Schema Registry client and serde settings (``url``, ``basic.auth.user.info``, ...): not for
    # the Kafka clients; the topology's registry serdes get them (``Topology.for_application``)
    registry: dict = field(default_factory=dict)

    def for_kind(self, kind: str) -> dict:
        if kind not in KINDS:
            raise ValueError(f"client kind must be one of {KINDS}, not {kind!r}")
        return {**self.common, **getattr(self, kind)}

    def with_kind(self, kind: str, settings: dict | None) -> ClientConfig:
        """A copy whose ``kind`` layer also holds ``settings`` (later wins)."""
        if not settings:
            return self
        _check_keys(settings, f"--{kind}-config")
        return ClientConfig(**{**self.__dict__, kind: {**getattr(self, kind), **settings}})

    def is_empty(self) -> bool:
        """True when the user set nothing (every client gets the defaults)."""
        return not (self.common or self.consumer or self.producer or self.admin or self.ignored
                    or self.registry)

    def describe(self) -> str:
        """One line, secrets redacted: what each client kind gets beyond the defaults."""
        parts = [f"{kind}: {describe_settings(self.for_kind(kind))}" for kind in KINDS]
        if self.registry:
            parts.append(f"schema registry: {describe_registry(self.registry)}")
        if self.ignored:
            parts.append(f"ignored (Java-only): {', '.join(self.ignored)}")
        return "; ".join(parts)

    def __repr__(self) -> str:   # never print a secret by accident
        return f"ClientConfig({self.describe()})"


@dataclass(frozen=True)
class KafkaCluster:
    """Where to connect and with which client settings. Every helper of
    ``processor.kafka.clients`` that takes ``bootstrap_servers`` takes one of these too; its
    ``str`` is the bootstrap servers (safe to print)."""

    bootstrap_servers: str
    config: ClientConfig = field(default_factory=ClientConfig)

    def __str__(self) -> str:
        return self.bootstrap_servers

    def __hash__(self) -> int:          # (the settings are dicts)
        return hash(self.bootstrap_servers)

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap_servers!r}, {self.config!r})"


# where a Kafka helper connects: a bootstrap string (default client settings) or a cluster with
# the user's settings (``processor.kafka.clients.cluster_of`` turns either into a cluster)
Cluster = str | KafkaCluster


def build_client_config(config_files=(), config_pairs=(), consumer_pairs=(), producer_pairs=(),
                        admin_pairs=(), registry_url: str | None = None, registry_pairs=()) -> ClientConfig:
    """The CLI's settings -> ClientConfig. ``*_pairs`` are ``KEY=VALUE`` strings (later wins);
    ``config_files`` Java ``.properties`` paths, applied before ``config_pairs``. Schema Registry
    settings: the registry keys of the common settings, then ``registry_pairs``
    (``--schema-registry-config``), then ``registry_url`` (``--schema-registry-url``)."""
    common: dict = {}
    for path in config_files:
        common.update(read_properties(path))
    common.update(parse_pairs(config_pairs, "--config"))
    common, registry = split_registry_settings(common)
    registry.update(parse_pairs(registry_pairs, "--schema-registry-config"))
    if registry_url:
        registry["url"] = registry_url
    common, ignored = translate_java(common)
    _check_keys(common, "--config")
    kinds = {}
    for kind, pairs in (("consumer", consumer_pairs), ("producer", producer_pairs), ("admin", admin_pairs)):
        settings, dropped = translate_java(parse_pairs(pairs, f"--{kind}-config"))
        _check_keys(settings, f"--{kind}-config")
        kinds[kind] = settings
        ignored += dropped
    return ClientConfig(common=common, ignored=tuple(dict.fromkeys(ignored)), registry=registry, **kinds)


def parse_pairs(pairs: Iterable[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` strings (of the repeatable flag ``flag``) -> ``{key: value}``, later wins; the
    one definition of the syntax (client settings, topic settings, ``--conf``, ``--archive``). A
    malformed entry is refused naming the flag, its value hidden (it may be a secret)."""
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        k = k.strip()
        if not sep or not k:
            shown = p if "=" not in p else f"{k}=*****"
            raise ConfigError(f"{flag}: expected KEY=VALUE, got {shown!r}")
        out[k] = v
    return out


def read_properties(path) -> dict:
    """A Java ``.properties`` file -> {key: value}: ``#``/``!`` comments, ``=``, ``:`` or
    whitespace separators, backslash line continuations and escapes (``\\t \\n \\uXXXX``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config-file {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_properties(text, str(path))


_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})")


def parse_properties(text: str, where: str = "properties") -> dict:
    out: dict = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip() if logical else raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        # a line ending in an odd number of backslashes continues on the next one
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry = "".join(logical)
        logical = []
        key, value = _split_entry(entry)
        out[_unescape(key)] = _unescape(value)
    if logical:
        key, value = _split_entry("".join(logical))
        out[_unescape(key)] = _unescape(value)
    return out


def _split_entry(entry: str) -> tuple[str, str]:
    i, n = 0, len(entry)
    while i < n:
        c = entry[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c.isspace():
            break
        i += 1
    key = entry[:i]
    rest = entry[i:].lstrip()
    if rest[:1] in ("=", ":") and (i < n and entry[i].isspace() or i < n and entry[i] in "=:"):
        rest = rest[1:].lstrip()
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    s = _UNICODE.sub(lambda m: chr(int(m.group(1), 16)), s)
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(_ESCAPES.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


_JAAS_MODULE = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+?))(?=\s|;|$)', re.S)


def translate_java(settings: dict) -> tuple[dict, list[str]]:
    """Java client keys -> librdkafka's (see the module docstring). Returns (settings, ignored)."""
    out = dict(settings)
    ignored = [k for k in JAVA_ONLY_IGNORED if k in out]
    for k in ignored:
        del out[k]
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        m = _JAAS_MODULE.match(jaas)
        if not m:
            raise ConfigError("sasl.jaas.config: cannot read it (expected '<LoginModule> required "
                              "key=\"value\" ...;')")
        module = m.group(1).rsplit(".", 1)[-1]
        options = {o.group(1): (o.group(2) if o.group(2) is not None else o.group(3))
                   for o in _JAAS_OPTION.finditer(m.group(3))}
        if module not in ("PlainLoginModule", "ScramLoginModule"):
            raise ConfigError(f"sasl.jaas.config: {module} has no librdkafka equivalent here; set "
                              f"librdkafka's sasl.* settings (e.g. sasl.oauthbearer.*) instead")
        for opt, target in (("username", "sasl.username"), ("password", "sasl.password")):
            if opt not in options:
                raise ConfigError(f"sasl.jaas.config: {module} without {opt}")
            out.setdefault(target, _unescape(options[opt]))
    store_type = out.get("ssl.truststore.type", "JKS").upper()
    if "ssl.truststore.location" in out:
        if store_type != "PEM":
            raise ConfigError(f"ssl.truststore.location: a {store_type} truststore is Java-only; "
                              f"convert it to PEM and set ssl.ca.location")
        out.setdefault("ssl.ca.location", out.pop("ssl.truststore.location"))
    out.pop("ssl.truststore.type", None)
    if "ssl.endpoint.identification.algorithm" in out:      # Java: "" disables, "https" enables
        value = out.pop("ssl.endpoint.identification.algorithm").strip().lower()
        out.setdefault("ssl.endpoint.identification.algorithm", "https" if value == "https" else "none")
    return out, ignored


def _check_keys(settings: dict, flag: str) -> None:
    for key in settings:
        if key in OWNED:
            raise ConfigError(f"{flag}: {key} is set by the processor ({OWNED[key]})")
