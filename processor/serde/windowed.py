"""Windowed key codec for output topics (a contract, Kafka Streams' ``TimeWindowedSerde`` layout).

Layout::

    {inner key bytes}{8-byte BE window start (ms)}

The window end is not written; it is ``start + size``, so the serde needs the window size.
"""

from __future__ import annotations

import struct

from processor.records import Windowed
from processor.serde import Serde

_START = struct.Struct(">q")


class WindowedSerde(Serde):
    name = "windowed"

    def __init__(self, inner: Serde, size_ms: int):
        self.inner = inner
        self.size_ms = size_ms

    def _identity(self):
        return (self.inner, self.size_ms)

    def for_topic(self, topic, is_key, config=None):
        inner = self.inner.for_topic(topic, is_key, config)
        return self if inner is self.inner else WindowedSerde(inner, self.size_ms)

    def serialize(self, key: Windowed):
        if key is None:
            return None
        return self.inner.serialize(key.key) + _START.pack(key.start)

    def deserialize(self, data):
        if data is None:
            return None
        if len(data) < 8:
            raise ValueError(f"windowed key too short ({len(data)} bytes)")
        (start,) = _START.unpack_from(data, len(data) - 8)
        return Windowed(self.inner.deserialize(data[:-8]), start, start + self.size_ms)

    def __repr__(self):
        return f"Serdes.windowed({self.inner!r}, {self.size_ms})"


class SessionWindowedSerde(Serde):
    """Keys of a session-windowed aggregate (Kafka Streams' ``SessionWindowedSerde`` layout,
    also the session store's key, ``processor/state/session_key.py``)::

        {inner key bytes}{8-byte BE session end (ms)}{8-byte BE session start (ms)}

    ``Windowed(key, start, end)``: ``end`` is the session's last record time (inclusive).
    """

    name = "session-windowed"

    def __init__(self, inner: Serde):
        self.inner = inner

    def _identity(self):
        return (self.inner,)

    def for_topic(self, topic, is_key, config=None):
        inner = self.inner.for_topic(topic, is_key, config)
        return self if inner is self.inner else SessionWindowedSerde(inner)

    def serialize(self, key: Windowed):
        if key is None:
            return None
        from processor.state import session_key

        return session_key.encode(self.inner.serialize(key.key), key.start, key.end)

    def deserialize(self, data):
        if data is None:
            return None
        from processor.state import session_key

        kb, start, end = session_key.decode(data)
        return Windowed(self.inner.deserialize(kb), start, end)

    def __repr__(self):
        return f"Serdes.session_windowed({self.inner!r})"
