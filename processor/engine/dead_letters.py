"""Dead letters: where a rejected input record goes under ``on_error='dlq'`` or ``'skip'``.

Invariant: a record the on-error policy rejects is, under ``skip``, counted and logged, and under
``dlq`` sent once to the dead-letter topic as it was read (key, value, timestamp, its own headers
first) followed by KIP-1034's headers (``DLQ_HEADERS``, built by ``dead_letter_headers``). A
dead-letter record is never larger than the producer's ``message.max.bytes`` (nor than the
dead-letter topic's own ``max.message.bytes``, when the host knows it): near the limit the
long texts (message, stack trace) are cut to 512 bytes, and a record that still does not fit (an
input at or above the limit, which a broker with a larger ``max.message.bytes`` accepted) goes as
a *stub* (``stub_of``): its key and value cut to what fits, its own headers kept only if they
leave room, and ``processor.errors.truncated`` saying what was cut. Processing goes on; stubs
are counted (``cut``, ``/metrics``' ``dead_lettered_cut``). Under ``fail`` the record's error is
raised as it is.

The stub's header ``processor.errors.truncated`` (UTF-8): ``key=<kept>/<length>;value=<kept>/
<length>;headers=<kept>/<count>``, lengths in bytes, ``-1`` for a null key or value. Its key and
value are prefixes of the input's; the full record stays at its topic, partition and offset.
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
TRUNCATED_HEADER = "processor.errors.truncated"   # on a stub only (see the module docstring)
STACKTRACE_LIMIT = 8192   # bytes of the stack trace header kept (its tail: the innermost frames)
_SHORTENED = ("__streams.errors.message", "__streams.errors.stacktrace")   # cut to 512 bytes near the limit
_TRUNCATED_ROOM = 96   # more than the truncated header ever takes, its name and varints included


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


def stub_of(key: bytes | None, value: bytes | None, headers: list, dlq_headers: list,
            max_record_bytes: int) -> tuple[bytes | None, bytes | None, list] | None:
    """The dead-letter stub of a record too large to dead-letter whole (the module docstring):
    ``(key, value, headers)`` within ``max_record_bytes``. ``dlq_headers``: KIP-1034's, shortened.
    The input's own ``headers`` are kept whole if they take at most half the limit, else dropped;
    key and value share what is left, each getting at least half of it if it needs it. None: the
    limit leaves no room even for the headers."""
    kept_headers = headers if wire_size(None, None, headers + dlq_headers) + _TRUNCATED_ROOM \
        <= max_record_bytes // 2 else []
    room = max_record_bytes - wire_size(None, None, kept_headers + dlq_headers) - _TRUNCATED_ROOM
    if room < 0:
        return None
    a, b = len(key or b""), len(value or b"")
    k = min(a, max(room - b, room // 2))
    v = min(b, room - k)
    cut = (f"key={k if key is not None else -1}/{a if key is not None else -1};"
           f"value={v if value is not None else -1}/{b if value is not None else -1};"
           f"headers={len(kept_headers)}/{len(headers)}")
    return (None if key is None else key[:k], None if value is None else value[:v],
            kept_headers + dlq_headers + [(TRUNCATED_HEADER, cut.encode())])


class DeadLetters:
    """One task's rejected records under its on-error policy, and their counts."""

    def __init__(self, on_error: str, dlq_topic: str | None, collector: RecordCollector, task_id: str,
                 topic_limit: int | None = None):
        self.on_error = on_error
        # the dead-letter topic's own limit, when below the producer's (startup_checks.dead_letter_record_limit)
        self.topic_limit = topic_limit
        self.dlq_topic = dlq_topic
        self.collector = collector
        self.task_id = task_id
        self.dead_lettered = 0
        self.cut = 0       # of them, sent as stubs (too large whole)
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
        if self.topic_limit is not None:
            max_record_bytes = min(max_record_bytes, self.topic_limit)
        own = list(headers or ())
        kip_headers = dead_letter_headers(exc)
        dlq_headers = own + kip_headers
        stub = False
        if wire_size(key, value, dlq_headers) > max_record_bytes:
            # an input near the limit: keep the names and the position, drop the long texts
            kip_headers = [(n, v[:512] if n in _SHORTENED else v) for n, v in kip_headers]
            dlq_headers = own + kip_headers
            if wire_size(key, value, dlq_headers) > max_record_bytes:   # too large whole: a stub
                cut = stub_of(key, value, own, kip_headers, max_record_bytes)
                if cut is None:
                    raise OutputError(f"cannot dead-letter this record: message.max.bytes ({max_record_bytes}) "
                                      f"leaves no room even for its dead-letter headers; it failed with: {exc.reason}",
                                      topic=exc.topic, partition=exc.partition, offset=exc.offset, step=exc.step)
                key, value, dlq_headers = cut
                stub = True
        assert self.dlq_topic is not None   # Task checks: on_error='dlq' needs a dead-letter topic
        self.collector.send(self.dlq_topic, key, value, timestamp, dlq_headers)
        self.dead_lettered += 1
        if stub:
            self.cut += 1
            log.warning("dead-lettered poison record to %s as a stub (too large whole for message.max.bytes %d; "
                        "%s): %s", self.dlq_topic, max_record_bytes, dlq_headers[-1][1].decode(), exc,
                        extra={"task": self.task_id, **record_fields(exc)})
            return
        log.warning("dead-lettered poison record to %s: %s", self.dlq_topic, exc,
                    extra={"task": self.task_id, **record_fields(exc)})
