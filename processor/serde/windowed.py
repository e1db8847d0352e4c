"""Windowed key codec for output topics (a contract, Kafka Streams' ``TimeWindowedSerde`` layout).

Layout::

    {inner key bytes}{8-byte BE window start (ms)}

The window end is not written; it is ``start + size``, so the serde needs the window size.
"""

from __future__ import annotations

import struct
from typing import Any

from processor.records import Windowed
from processor.serde import Serde

_START = struct.Struct(">q")


class WindowedSerde(Serde):
    """Keys of a time-windowed aggregate (Kafka Streams: ``TimeWindowedSerde``); the layout is this module's."""
    name = "windowed"

    def __init__(self, inner: Serde, size_ms: int):
        # (Any: a key serde gives bytes for a key that is not None, which Serde's type cannot say)
        self.inner: Any = inner
        self.size_ms = size_ms

    def _identity(self) -> tuple:
        return (self.inner, self.size_ms)

    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> Serde:
        """This serde with its inner serde bound to ``topic`` (see ``Serde.for_topic``)."""
        inner = self.inner.for_topic(topic, is_key, config)
        return self if inner is self.inner else WindowedSerde(inner, self.size_ms)

    def serialize(self, key: Windowed | None) -> bytes | None:
        """``{inner key bytes}{8-byte BE window start}``; None stays None."""
        if key is None:
            return None
        return self.inner.serialize(key.key) + _START.pack(key.start)

    def deserialize(self, data: bytes | None) -> Windowed | None:
        """The ``Windowed(key, start, start + size)`` of the bytes; None stays None."""
        if data is None:
            return None
        if len(data) < 8:
            raise ValueError(f"windowed key too short ({len(data)} bytes)")
        (start,) = _START.unpack_from(data, len(data) - 8)
        return Windowed(self.inner.deserialize(data[:-8]), start, start + self.size_ms)

    def __repr__(self) -> str:
        return f"Serdes.windowed({self.inner!r}, {self.size_ms})"


class SessionWindowedSerde(Serde):
    """Keys of a session-windowed aggregate (Kafka Streams: ``SessionWindowedSerde``).

    Also the session store's key (``processor/state/session_key.py``)::

        {inner key bytes}{8-byte BE session end (ms)}{8-byte BE session start (ms)}

    ``Windowed(key, start, end)``: ``end`` is the session's last record time (inclusive).
    """

    name = "session-windowed"

    def __init__(self, inner: Serde):
        # (Any: a key serde gives bytes for a key that is not None, which Serde's type cannot say)
        self.inner: Any = inner

    def _identity(self) -> tuple:
        return (self.inner,)

    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> Serde:
        """This serde with its inner serde bound to ``topic`` (see ``Serde.for_topic``)."""
        inner = self.inner.for_topic(topic, is_key, config)
        return self if inner is self.inner else SessionWindowedSerde(inner)

    def serialize(self, key: Windowed | None) -> bytes | None:
        """``{inner key bytes}{8-byte BE end}{8-byte BE start}``; None stays None."""
        if key is None:
            return None
        from processor.state import session_key

        return session_key.encode(self.inner.serialize(key.key), key.start, key.end)

    def deserialize(self, data: bytes | None) -> Windowed | None:
        """The ``Windowed(key, start, end)`` of the bytes; None stays None."""
        if data is None:
            return None
        from processor.state import session_key

        kb, start, end = session_key.decode(data)
        return Windowed(self.inner.deserialize(kb), start, end)

    def __repr__(self) -> str:
        return f"Serdes.session_windowed({self.inner!r})"
