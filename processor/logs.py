"""Log output of the ``processor`` command: ``--log-format text`` (the default, one readable line
per record) or ``json`` (one JSON object per line, for log shippers).

A JSON line carries ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, and where the
code that logged knows them, the record's position: ``task``, ``topic``, ``partition``,
``offset`` (passed as ``extra=``; see ``RECORD_FIELDS``), and ``exception`` (the traceback) when
one is attached.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RECORD_FIELDS = ("task", "topic", "partition", "offset", "step")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name in RECORD_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str | int, fmt: str = "text", stream=None) -> None:
    """The root logger's one handler, on stderr by default."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def record_fields(exc) -> dict:
    """``extra=`` for a log line about the record an error names (``processor.errors.RecordError``)."""
    return {name: getattr(exc, name, None) for name in ("topic", "partition", "offset", "step")}
