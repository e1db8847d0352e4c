"""Errors raised by the processor, each translated at a boundary and carrying its context.

Every error that concerns a record names where the record came from (topic, partition,
offset) and the step (processor node and, where there is one, the user function).
"""

from __future__ import annotations


class ProcessorError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(ProcessorError):
    """Bad configuration, unreachable broker, missing topic, unresolvable MODULE:ATTR."""


class TopologyError(ProcessorError):
    """The topology as built cannot run (bad wiring, a failed optimization sanity check)."""


def _where(topic, partition, offset) -> str:
    return f"{topic}[{partition}]@{offset}"


class RecordError(ProcessorError):
    """An error about one record: names its provenance and the step that failed."""

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

    def with_provenance(self, topic, partition, offset) -> "RecordError":
        """The same error, naming the input record (the runtime adds this at its boundary)."""
        if self.topic is not None:
            return self
        err = type(self)(self.reason, topic=topic, partition=partition, offset=offset, step=self.step)
        err.__cause__ = self.__cause__
        return err


class SerializationError(RecordError):
    """A key or value could not be (de)serialized."""


class DeserializationError(SerializationError):
    """An input record's key or value could not be read: a poison record (see on_error policy)."""


class ProcessingError(RecordError):
    """A user function or operator failed on a record."""


class StateError(ProcessorError):
    """A state store could not be opened, read or written."""
