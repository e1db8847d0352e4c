"""Dead letters: where a rejected input record goes under ``on_error='dlq'`` or ``'skip'``.

Invariant: a record the on-error policy rejects is, under ``skip``, counted and logged, and under
``dlq`` sent once to the dead-letter topic as it was read (key, value, timestamp, its own headers
first) followed by KIP-1034's headers (``DLQ_HEADERS``, built by ``dead_letter_headers``). A
dead-letter record is never larger than the producer's ``message.max.bytes``: the long texts
(message, stack trace) are cut to 512 bytes, and a record still too large is fatal
(``OutputError``). Under ``fail`` the record's error is raised as it is.
"""

from __future__ import annotations

import logging
import traceback

from processor.engine.protocols import RecordCollector
from processor.engine.record_size import wire_size
from processor.errors import OutputError, RecordError
from processor.logs import record_fields

log = logging.getLogger("processor.task")

# Dead-letter record headers (values UTF-8), after them the input record's own headers first:
# KIP-1034's names, then the step that failed (a processor node's name).
DLQ_HEADERS = ("__streams.errors.exception", "__streams.errors.message", "__streams.errors.stacktrace",
               "__streams.errors.topic", "__streams.errors.partition", "__streams.errors.offset",
               "processor.errors.step")
STACKTRACE_LIMIT = 8192   # bytes of the stack trace header kept (its tail: the innermost frames)
_SHORTENED = ("__streams.errors.message", "__streams.errors.stacktrace")   # cut to 512 bytes near the limit


def dlq_topic_for(application_id: str) -> str:
    return f"{application_id}-dlq"


def dead_letter_headers(exc: RecordError) -> list[tuple[str, bytes]]:
    """KIP-1034's dead-letter headers for ``exc`` (which names the input record), then the step.
    ``exception`` is the class of what was raised first (the user function's exception, the
    serde's); ``message`` is this product's one-line error (record, step, function, cause)."""
    cause = exc.__cause__
    cls = type(exc if cause is None else cause)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    if cause is None:   # raised by this product, not by user code: its reason is the whole story
        trace = f"{name}: {exc.reason}\n".encode("utf-8", "replace")
    else:
        trace = "".join(traceback.format_exception(cause)).encode("utf-8", "replace")
    if len(trace) > STACKTRACE_LIMIT:
        trace = b"...\n" + trace[-STACKTRACE_LIMIT:]
    return [
        ("__streams.errors.exception", name.encode()),
        ("__streams.errors.message", str(exc).encode("utf-8", "replace")),
        ("__streams.errors.stacktrace", trace),
        ("__streams.errors.topic", str(exc.topic).encode()),
        ("__streams.errors.partition", str(exc.partition).encode()),
        ("__streams.errors.offset", str(exc.offset).encode()),
        ("processor.errors.step", str(exc.step).encode()),
    ]


class DeadLetters:
    """One task's rejected records under its on-error policy, and their counts."""

    def __init__(self, on_error: str, dlq_topic: str | None, collector: RecordCollector, task_id: str):
        self.on_error = on_error
        self.dlq_topic = dlq_topic
        self.collector = collector
        self.task_id = task_id
        self.dead_lettered = 0
        self.skipped = 0

    def reject(self, exc: RecordError, key: bytes | None, value: bytes | None, timestamp: int, headers,
               max_record_bytes: int) -> None:
        """Apply the policy to the input record ``exc`` names (``exc`` carries its position)."""
        if self.on_error == "fail":
            raise exc
        if self.on_error == "skip":
            self.skipped += 1
            log.warning("skipped poison record (on_error=skip): %s", exc,
                        extra={"task": self.task_id, **record_fields(exc)})
            return
        dlq_headers = list(headers or ()) + dead_letter_headers(exc)
        if wire_size(key, value, dlq_headers) > max_record_bytes:
            # an input near the limit: keep the names and the position, drop the long texts
            dlq_headers = [(n, v[:512] if n in _SHORTENED else v) for n, v in dlq_headers]
            if wire_size(key, value, dlq_headers) > max_record_bytes:
                raise OutputError(f"cannot dead-letter this record: with its dead-letter headers it is larger "
                                  f"than message.max.bytes ({max_record_bytes}); it failed with: {exc.reason}",
                                  topic=exc.topic, partition=exc.partition, offset=exc.offset, step=exc.step)
        assert self.dlq_topic is not None   # Task checks: on_error='dlq' needs a dead-letter topic
        self.collector.send(self.dlq_topic, key, value, timestamp, dlq_headers)
        self.dead_lettered += 1
        log.warning("dead-lettered poison record to %s: %s", self.dlq_topic, exc,
                    extra={"task": self.task_id, **record_fields(exc)})
