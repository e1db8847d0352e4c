"""The types of the user functions the DSL and the Processor API take, named as in Kafka Streams.

Invariant: every parameter of the public API that takes a user function is annotated with one
of these aliases, and each alias is defined here only. They are plain ``Callable`` aliases:
nothing checks them at run time (a function is called as it is, with no wrapper), so they cost
nothing per record. Keys, values and aggregates are ``Any``: the serdes decide what they are.

Each alias names its Kafka Streams interface (``org.apache.kafka.streams.kstream``):

* ``Predicate``: ``(key, value) -> bool`` (``Predicate``; ``filter``, ``filter_not``, ``split``).
* ``ValueMapper``: ``(value) -> new value`` (``ValueMapper``; ``map_values``).
* ``FlatValueMapper``: ``(value) -> iterable of values`` (``ValueMapper<V, Iterable<VR>>``;
  ``flat_map_values``).
* ``KeyValueMapper``: ``(key, value) -> result`` (``KeyValueMapper``): a ``(key, value)`` pair
  for ``map`` and ``KTable.group_by``, a new key for ``select_key`` and ``KStream.group_by``, an
  iterable of pairs for ``flat_map``.
* ``KeySelector``: ``(key, value) -> key``: the ``KeyValueMapper`` that picks a key
  (``select_key``, ``KStream.group_by``, a global table join's ``key_selector``).
* ``ValueJoiner``: ``(left value, right value) -> joined value`` (``ValueJoiner``).
* ``ForeignKeyExtractor``: ``(value) -> foreign key`` or ``(key, value) -> foreign key``
  (``KTable#join(other, foreignKeyExtractor, joiner)``; the arity is read once, when the join
  is built).
* ``Initializer``: ``() -> initial aggregate`` (``Initializer``).
* ``Aggregator``: ``(key, value, aggregate) -> new aggregate`` (``Aggregator``).
* ``Reducer``: ``(aggregate, value) -> new aggregate`` (``Reducer``).
* ``Merger``: ``(key, aggregate1, aggregate2) -> merged aggregate`` (``Merger``; session windows).
* ``ForeachAction``: ``(key, value) -> None`` (``ForeachAction``; ``peek``, ``foreach``).
* ``TopicNameExtractor``: ``(key, value) -> topic`` (``TopicNameExtractor``; ``to``).
* ``TimestampExtractor``: ``(key, value, record timestamp) -> event time in ms``
  (``TimestampExtractor``; sources).
* ``ProcessorSupplier``: ``() -> Processor``: a ``Processor`` subclass or a factory of one
  (``ProcessorSupplier``; ``KStream.process``).
* ``Punctuator``: ``(time in ms) -> None`` (``Punctuator``; ``ProcessorContext.schedule``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    from processor.papi import Processor

__all__ = ["Predicate", "ValueMapper", "KeyValueMapper", "KeySelector", "ValueJoiner", "ForeignKeyExtractor",
           "Initializer", "Aggregator", "Reducer", "Merger", "ForeachAction", "TopicNameExtractor",
           "TimestampExtractor", "ProcessorSupplier", "Punctuator", "FlatValueMapper"]

Predicate: TypeAlias = Callable[[Any, Any], bool]
ValueMapper: TypeAlias = Callable[[Any], Any]
FlatValueMapper: TypeAlias = Callable[[Any], Iterable[Any]]
KeyValueMapper: TypeAlias = Callable[[Any, Any], Any]
KeySelector: TypeAlias = Callable[[Any, Any], Any]
ValueJoiner: TypeAlias = Callable[[Any, Any], Any]
ForeignKeyExtractor: TypeAlias = Callable[[Any], Any] | Callable[[Any, Any], Any]
Initializer: TypeAlias = Callable[[], Any]
Aggregator: TypeAlias = Callable[[Any, Any, Any], Any]
Reducer: TypeAlias = Callable[[Any, Any], Any]
Merger: TypeAlias = Callable[[Any, Any, Any], Any]
ForeachAction: TypeAlias = Callable[[Any, Any], None]
TopicNameExtractor: TypeAlias = Callable[[Any, Any], str]
TimestampExtractor: TypeAlias = Callable[[Any, Any, int], int]
ProcessorSupplier: TypeAlias = "Callable[[], Processor]"
Punctuator: TypeAlias = Callable[[int], None]
