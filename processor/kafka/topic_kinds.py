"""The kinds of internal topic and the cleanup policy each needs: plain rules, no Kafka client
(the settings object, ``processor.config.StreamsConfig``, checks the user's per-kind topic
settings with them wherever it is made, the ``TopologyTestDriver`` included).

Invariant: a changelog is compacted (a restore reads the last write per key); a repartition or
foreign-key topic is not (every record is read once, and compaction would thin them).
``processor.kafka.internal_topics`` creates and checks the topics by these rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from processor.errors import ConfigError

KINDS = ("changelog", "repartition", "foreign-key")
# what each kind's cleanup.policy must (not) hold
NEEDS_COMPACT = {"changelog": True, "repartition": False, "foreign-key": False}


def is_compact(policy: str) -> bool:
    """Whether the ``cleanup.policy`` value compacts (``compact``, ``compact,delete``)."""
    return "compact" in {p.strip() for p in str(policy).split(",")}


def need(kind: str) -> str:
    """The cleanup policy topics of ``kind`` need, as the user sets it."""
    return "cleanup.policy=compact" if NEEDS_COMPACT[kind] else "cleanup.policy=delete (not compacted)"


def check_kind_configs(configs: Mapping[str, dict] | None) -> dict[str, dict]:
    """The user's per-kind topic settings, refusing one that breaks the kind's contract."""
    configs = dict(configs or {})
    for kind, conf in configs.items():
        if kind not in KINDS:
            raise ConfigError(f"internal topic kind must be one of {KINDS}, not {kind!r}")
        policy = conf.get("cleanup.policy")
        if policy is not None and is_compact(policy) != NEEDS_COMPACT[kind]:
            raise ConfigError(f"--{kind}-topic-config cleanup.policy={policy}: {kind} topics need "
                              f"{need(kind)}")
    return configs
