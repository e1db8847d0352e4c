"""The settings both hosts (the worker and the backfill) share, validated once: ``StreamsConfig``.

Invariant: a ``StreamsConfig`` that exists is valid. Every setting is checked when it is made
(``__post_init__``), each bad value refused with one ``ConfigError`` naming the setting, the
value and what is allowed; nothing downstream checks them again. The allowed values are the
module constants below, the only definition in the codebase: the worker, the backfill, the
engine's ``Task``, ``TopologyTestDriver`` and the ``processor`` command's ``choices=`` take them
from here.

The rules that follow from the settings are written here once too:

- the **isolation level** of every consumer a host opens (group, restore, probes, the backfill's
  history readers): ``read_committed`` under ``exactly_once``, ``read_uncommitted`` otherwise,
  unless the consumer settings name an ``isolation.level`` (Kafka Streams' rule;
  ``isolation_level``);
- the **client layering** per kind: ``clients`` is a ``processor.kafka.client_config.ClientConfig``
  (common settings, then per kind); ``StreamsConfig.of`` layers a host's ``consumer_config`` /
  ``producer_config`` keywords over it, as ``ClientConfig.with_kind`` does.

Kafka Streams' ``StreamsConfig`` is the model: validated at construction, every client taking its
overrides from it. Plain data, frozen and picklable (the backfill ships it to Spark executors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.errors import ConfigError
from processor.kafka.client_config import ClientConfig

PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")
ON_ERROR_POLICIES = ("dlq", "skip", "fail")
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")

# the settings ``StreamsConfig.of`` takes as keywords, besides the client layers
_SETTINGS = ("processing_guarantee", "on_error", "commit_interval_ms", "max_task_idle_ms",
             "replication_factor", "topic_configs", "num_standby_replicas", "acceptable_recovery_lag",
             "max_warmup_replicas", "application_server")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")


def check_application_server(server: object) -> tuple[str, int]:
    """``"host:port"`` -> (host, port), or a ``ConfigError`` naming what is wrong."""
    text = str(server)
    host, sep, port = text.rpartition(":")
    if not isinstance(server, str) or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 \
            or any(c.isspace() or c in "/?#@" for c in host):
        raise ConfigError(f"application_server must be host:port (the address other workers and clients "
                          f"use to reach this worker's HTTP endpoint), not {server!r}")
    return host.strip("[]"), int(port)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Kafka Streams' (librdkafka's own default is 60 s): a worker that dies with a transaction open
# holds read_committed readers back until the broker aborts it on this timeout
EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class StreamsConfig:
    """The settings of one application's hosts.

    ``processing_guarantee``: ``at_least_once`` or ``exactly_once`` (outputs, changelogs and input
    offsets of each commit in one Kafka transaction). ``on_error``: what happens to a record that
    fails (``dlq``: to the dead-letter topic; ``skip``: counted and logged; ``fail``: stop).
    ``clients``: the Kafka client settings, common and per kind. ``commit_interval_ms``: how often
    the worker commits. ``max_task_idle_ms``: how long a task reading several partitions waits for
    one that looks empty (-1: never). ``replication_factor`` (None: min(3, brokers)) and
    ``topic_configs`` (per internal topic kind) of the internal topics created.

    The fleet (docs/fleet.md): ``num_standby_replicas`` copies of each stateful task's stores kept
    on other workers; a task moves to a worker more than ``acceptable_recovery_lag`` changelog
    records behind only after a warm-up there (at most ``max_warmup_replicas`` at once);
    ``application_server`` ("host:port"): where other workers and clients reach this worker's
    HTTP endpoint.
    """

    processing_guarantee: str = "at_least_once"
    on_error: str = "dlq"
    clients: ClientConfig = field(default_factory=ClientConfig)
    commit_interval_ms: int | float = 1000
    max_task_idle_ms: int = 0
    replication_factor: int | None = None
    topic_configs: Mapping[str, dict] = field(default_factory=dict)
    num_standby_replicas: int = 0
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    application_server: str | None = None

    def __post_init__(self) -> None:
        from processor.kafka.topic_kinds import check_kind_configs

        _check_choice("processing_guarantee", self.processing_guarantee, PROCESSING_GUARANTEES)
        _check_choice("on_error", self.on_error, ON_ERROR_POLICIES)
        if not isinstance(self.clients, ClientConfig):
            raise ConfigError(f"clients must be a ClientConfig, not a {type(self.clients).__name__}")
        given = self.clients.for_kind("consumer").get("isolation.level")
        if given is not None:
            _check_choice("consumer setting isolation.level", given, ISOLATION_LEVELS)
        interval = self.commit_interval_ms
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
            raise ConfigError(f"commit_interval_ms must be a number >= 0, not {interval!r}")
        idle = self.max_task_idle_ms
        if not _is_int(idle) or idle < -1:
            raise ConfigError(f"max_task_idle_ms must be an integer >= -1 (-1: never wait for an empty "
                              f"partition; 0: only for one known to have data), not {idle!r}")
        rf = self.replication_factor
        if rf is not None and (not _is_int(rf) or rf < 1):
            raise ConfigError(f"replication_factor must be an integer of at least 1 (or None: min(3, "
                              f"brokers)), not {rf!r}")
        object.__setattr__(self, "topic_configs", check_kind_configs(self.topic_configs))
        for name, low in (("num_standby_replicas", 0), ("acceptable_recovery_lag", 0), ("max_warmup_replicas", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, not {value!r}")
        if self.application_server is not None:
            check_application_server(self.application_server)
        if self.processing_guarantee == "exactly_once":
            timeout = self.transaction_timeout_ms
            if timeout < interval:
                raise ConfigError(f"producer setting transaction.timeout.ms ({timeout}) is below commit_interval_ms "
                                  f"({interval}): every transaction would time out before its commit; raise "
                                  f"transaction.timeout.ms or lower commit_interval_ms")

    @classmethod
    def of(cls, config: StreamsConfig | None = None, *, client_config: ClientConfig | None = None,
           consumer_config: dict | None = None, producer_config: dict | None = None,
           **settings: Any) -> StreamsConfig:
        """A host's keyword arguments -> its ``StreamsConfig``: ``config`` when given (then no
        setting may also be given as a keyword, except the per-kind client layers), else one
        made of ``settings`` and ``client_config``; ``consumer_config`` / ``producer_config``
        layered over the client settings' kinds."""
        unknown = set(settings) - set(_SETTINGS)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        if config is None:
            clients = (client_config or ClientConfig()).with_kind("consumer", consumer_config) \
                .with_kind("producer", producer_config)
            return cls(clients=clients, **settings)
        default = cls()
        # (topic_configs=None: none, as the default {})
        beside = sorted(k for k, v in settings.items()
                        if v != getattr(default, k) and not (k == "topic_configs" and v is None))
        if client_config is not None:
            beside.append("client_config")
        if beside:
            raise ConfigError(f"{', '.join(beside)} given beside config=StreamsConfig(...): set "
                              f"{'it' if len(beside) == 1 else 'them'} in the StreamsConfig")
        if not (consumer_config or producer_config):
            return config
        clients = config.clients.with_kind("consumer", consumer_config).with_kind("producer", producer_config)
        return dataclasses.replace(config, clients=clients)

    @property
    def isolation_level(self) -> str:
        """The isolation level of every consumer a host opens, as in Kafka Streams:
        ``read_committed`` under ``exactly_once``, ``read_uncommitted`` otherwise; a consumer
        setting ``isolation.level`` overrides it. (On a broker whose read_committed hides no
        aborted record and whose last stable offset can stay behind a transaction it never
        completes, Tansu: README "Reliability", read_uncommitted loses nothing and cannot block.)"""
        given = self.clients.for_kind("consumer").get("isolation.level")
        if given is not None:
            return given
        return "read_committed" if self.processing_guarantee == "exactly_once" else "read_uncommitted"

    @property
    def transaction_timeout_ms(self) -> int:
        """Exactly once: how long the broker lets a transaction stay open before aborting it (the
        producer setting; 10 s, Kafka Streams' value, unless given: the worker sets it on its
        transactional producer, where librdkafka's own default is 60 s). A worker that dies
        mid-transaction holds read_committed readers of its outputs and changelogs, the survivor
        taking its tasks over included, back until then. (librdkafka also caps
        ``message.timeout.ms`` at it, so with 10 s a
        broker paused for 20 s times the open transaction's records out: the worker aborts it,
        rebuilds its tasks from their changelogs and goes on, with a new producer if the broker
        fenced the old one on the timeout: ``processor/runtime/commit_unit.py``,
        ``tests/integration/test_broker_freeze.py``.)"""
        given = self.clients.for_kind("producer").get("transaction.timeout.ms")
        try:
            return int(given) if given is not None else EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS
        except (TypeError, ValueError):
            raise ConfigError(f"producer setting transaction.timeout.ms must be an integer, not {given!r}") from None

    def clients_at_isolation_level(self) -> ClientConfig:
        """``clients`` whose consumer layer names ``isolation_level`` (for hosts that pass the
        consumer settings on as they are: the backfill's driver and executors)."""
        if "isolation.level" in self.clients.for_kind("consumer"):
            return self.clients
        return self.clients.with_kind("consumer", {"isolation.level": self.isolation_level})
