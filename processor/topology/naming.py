"""Names of the topics a topology creates, as Kafka Streams names them.

Invariant: the logical graph knows internal topics by a base name (``<name>-repartition``,
``<name>-subscription-...-topic``); every host runs the copy ``name_internal_topics`` gives
(``<application-id>-<base>``); a store's changelog is ``<application-id>-<store>-changelog``,
the per-sub-topology stores' ``<application-id>-<store>-<sub>-changelog``.
"""

from __future__ import annotations

from processor.graph import SinkAttrs, SourceAttrs
from processor.state.store import BOOKKEEPING_STORE, TASK_STORE


def repartition_topic(name: str) -> str:
    """The base name of the repartition topic a node or store ``name`` writes through."""
    return f"{name}-repartition"


def application_topic(application_id: str, base: str) -> str:
    return f"{application_id}-{base}"


def name_internal_topics(nodes, application_id: str) -> None:
    """Complete the internal topic names of ``nodes`` (a clone) for ``application_id``."""
    for n in nodes:
        base = n.attrs.internal_topic if isinstance(n.attrs, (SourceAttrs, SinkAttrs)) else None
        if base:
            topic = application_topic(application_id, base)
            if n.source_topic:
                n.source_topic = topic
            if n.sink_topic:
                n.sink_topic = topic


def changelog_topic(application_id: str | None, store: str, sub_id: int | None = None) -> str:
    """``<application-id>-<store>-changelog``; the task store (``__task``) and the bookkeeping
    store (``_bookkeeping``), one per sub-topology, are ``<application-id>-<store>-<sub>-changelog``."""
    app = application_id or "<application-id>"
    if store in (TASK_STORE, BOOKKEEPING_STORE):
        return f"{app}-{store}-{sub_id}-changelog"
    return f"{app}-{store}-changelog"
