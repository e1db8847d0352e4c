"""Errors raised by the processor, each translated at a boundary and carrying its context.

Every error that concerns a record names where the record came from (topic, partition,
offset) and the step (processor node and, where there is one, the user function).

Each class carries the exit code of the ``processor`` command (``exit_code``); ``processor.cli``
prints the error as one line, ``processor: error: <message>``, and exits with it:

====  ==============================================================  =============================
code  meaning                                                         raised as
====  ==============================================================  =============================
0     stopped cleanly (SIGTERM/SIGINT)
1     anything else: an unexpected exception (with its traceback), a  ProcessorError, StateError,
      store that cannot be opened                                     (any other subclass)
2     configuration or usage: bad arguments, unresolvable             ConfigError, TopologyError
      MODULE:ATTR, missing topic, partition-count mismatch, a
      topology that cannot run
3     the broker did not answer within the startup timeout            BrokerUnreachable
4     the state directory cannot be used: locked by another worker    StateDirUnusable
      process, its worker id claimed by another live worker (a        (StateDirLocked,
      copied directory), read-only, full, or a broken ``worker.id``   CopiedStateDir)
5     local state does not match its changelog                        ChangelogMismatch
6     a record failed under ``--on-error fail``: it did not            RecordError (UserFunctionError,
      deserialize, a user function raised, an output did not          DeserializationError,
      serialize or is too large; or an internal record is unreadable  OutputError, ProcessingError)
7     a Kafka read or write failed at run time: outputs or changelogs  KafkaIOError (DeliveryFailed)
      not delivered, a restore or a read that failed or stalled
8     the Schema Registry stayed unusable past the bound              SchemaRegistryUnavailable
      (``outage.timeout.ms``): unreachable, timing out, answering
      5xx or 429, or refusing the credentials (401/403)
130   interrupted (SIGINT before the worker took over the signal)
====  ==============================================================  =============================
"""

from __future__ import annotations

from typing import Self


class ProcessorError(Exception):
    """Base class of every error this package raises on purpose. ``undone_record``: set by a
    task when an error that is not a record's (``is_operational``) met an input record whose
    every write it undid: ``(topic, partition, offset)``; what came before it may be committed."""

    exit_code = 1
    undone_record: tuple[str, int, int] | None = None


class ConfigError(ProcessorError):
    """Bad configuration or usage: missing topic, partition-count mismatch, unresolvable MODULE:ATTR."""

    exit_code = 2


class BrokerUnreachable(ConfigError):
    """The broker did not answer (wrong ``--bootstrap-servers``, broker down, network)."""

    exit_code = 3


class TopologyError(ProcessorError):
    """The topology as built cannot run (bad wiring, a failed optimization sanity check)."""

    exit_code = 2


def _where(topic, partition, offset) -> str:
    return f"{topic}[{partition}]@{offset}"


class RecordError(ProcessorError):
    """An error about one record: names its provenance and the step that failed."""

    exit_code = 6

    def __init__(self, message: str, *, topic=None, partition=None, offset=None, step=None):
        self.topic, self.partition, self.offset, self.step = topic, partition, offset, step
        self.reason = message
        parts = []
        if topic is not None:
            parts.append(f"record {_where(topic, partition, offset)}")
        if step is not None:
            parts.append(f"step {step}")
        prefix = (", ".join(parts) + ": ") if parts else ""
        super().__init__(prefix + message)

    def with_provenance(self, topic, partition, offset) -> Self:
        """The same error, naming the input record (the runtime adds this at its boundary)."""
        if self.topic is not None:
            return self
        err = type(self)(self.reason, topic=topic, partition=partition, offset=offset, step=self.step)
        err.__cause__ = self.__cause__
        return err


def is_operational(exc: BaseException) -> bool:
    """Whether ``exc`` is one of this package's errors that concerns no record (any
    :class:`ProcessorError` but a :class:`RecordError`, e.g. :class:`SchemaRegistryUnavailable`).

    Where a serde's failure becomes the record's (a ``DeserializationError`` or an
    ``OutputError``, then the ``on_error`` policy), such an error is raised as it is instead.
    """
    return isinstance(exc, ProcessorError) and not isinstance(exc, RecordError)


class SerializationError(RecordError):
    """A key or value could not be (de)serialized."""


class DeserializationError(SerializationError):
    """An input record's key or value could not be read: a poison record (see on_error policy)."""


class ProcessingError(RecordError):
    """A user function or operator failed on a record."""


class UserFunctionError(ProcessingError):
    """A user function (predicate, mapper, key selector, aggregator, joiner, FK extractor, ...)
    raised on a record. ``function`` names it; ``cause`` is what it raised. Follows the
    ``on_error`` policy (dead-lettered, skipped or fatal)."""

    def __init__(self, message: str, *, function: str | None = None, **where):
        super().__init__(message, **where)
        self.function = function

    def with_provenance(self, topic, partition, offset) -> Self:
        err = super().with_provenance(topic, partition, offset)
        err.function = self.function
        return err


class OutputError(SerializationError):
    """An output of a record cannot be produced: its value does not serialize, or the record is
    larger than the producer's ``message.max.bytes``. Follows the ``on_error`` policy: the input
    record that caused it is dead-lettered, skipped or fatal."""


class KafkaIOError(ProcessorError):
    """A Kafka read or write failed while running (not a configuration problem): records not
    delivered, a changelog restore or a read that failed or made no progress."""

    exit_code = 7


class SchemaRegistryUnavailable(ProcessorError):
    """The Schema Registry could not be used for longer than the bound (``outage.timeout.ms``,
    ``processor/serde/registry.py``): unreachable, timing out, answering 5xx or 429, or refusing
    the credentials (401/403). Not a record error: the record that met it is neither
    dead-lettered nor skipped under any ``on_error`` policy, and nothing is committed past it;
    the worker stops (the backfill fails) and reads it again once restarted. Like every
    :class:`ProcessorError` that is not a :class:`RecordError`, the operators let it through
    unwrapped."""

    exit_code = 8


class StateError(ProcessorError):
    """A state store could not be opened, read or written."""


class StateDirUnusable(StateError):
    """The state directory cannot be used: read-only, full, not writable, its ``worker.id``
    broken, or claimed by another live worker (``processor/runtime/worker_identity.py``)."""

    exit_code = 4


class StateDirLocked(StateDirUnusable):
    """Another worker process holds the state directory (see ``processor.runtime.state_lock``)."""


class CopiedStateDir(StateDirUnusable):
    """Another live worker, another process, claims this state directory's worker id: the
    directory was copied with its ``worker.id`` (``processor/runtime/worker_identity.py``)."""


class ChangelogMismatch(StateError):
    """Local state does not match its changelog (e.g. the local checkpoint is ahead of the
    changelog's end, or the changelog was recreated): refuse to run on it."""

    exit_code = 5
