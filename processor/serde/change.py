"""Change codec: one ``Change(new, old)`` as the value of a repartition record (a contract).

A table grouped by a new key travels through its repartition topic as changes: when a row's
group changes, ``(None<-old)`` goes to the old group and ``(new<-None)`` to the new one, as two
records; when it does not change, one record carries both sides (KIP-904), so the aggregate
subtracts and adds in one step.

Layout (the inner serde's bytes for each side)::

    {version = 1}{flags}{4-byte BE length of new}{new bytes}{old bytes}
    flags: bit 0 = new present, bit 1 = old present; absent sides have no length and no bytes

Unknown versions and unknown flag bits are rejected.
"""

from __future__ import annotations

import struct

from processor.records import Change
from processor.serde import Serde

VERSION = 1
_HAS_NEW = 1
_HAS_OLD = 2
_LEN = struct.Struct(">I")


def encode(new: bytes | None, old: bytes | None) -> bytes:
    """The bytes of a change from the bytes of its sides (the layout is this module's)."""
    flags = (_HAS_NEW if new is not None else 0) | (_HAS_OLD if old is not None else 0)
    parts = [bytes((VERSION, flags))]
    if new is not None:
        parts.append(_LEN.pack(len(new)))
        parts.append(new)
    if old is not None:
        parts.append(old)
    return b"".join(parts)


def decode(data: bytes) -> tuple[bytes | None, bytes | None]:
    """``(new bytes, old bytes)`` of a change's bytes.

    Raises:
        ValueError: The bytes are no change record of this version.
    """
    if len(data) < 2:
        raise ValueError(f"change record too short ({len(data)} bytes)")
    if data[0] != VERSION:
        raise ValueError(f"unknown change record version {data[0]} (this build reads {VERSION})")
    flags = data[1]
    if flags & ~(_HAS_NEW | _HAS_OLD):
        raise ValueError(f"unknown change record flags {flags:#04x}")
    pos = 2
    new = old = None
    if flags & _HAS_NEW:
        if len(data) < pos + 4:
            raise ValueError("change record truncated in the new value's length")
        (n,) = _LEN.unpack_from(data, pos)
        pos += 4
        if len(data) < pos + n:
            raise ValueError("change record truncated in the new value")
        new = data[pos:pos + n]
        pos += n
    if flags & _HAS_OLD:
        old = data[pos:]
    elif pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes after the change record")
    return new, old


class ChangeSerde(Serde):
    """``Change(new, old)`` <-> bytes, each side with ``inner``."""

    name = "change"

    def __init__(self, inner: Serde):
        self.inner = inner

    def _identity(self) -> tuple:
        return (self.inner,)

    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> Serde:
        """This serde with its inner serde bound to ``topic`` (see ``Serde.for_topic``)."""
        inner = self.inner.for_topic(topic, is_key, config)
        return self if inner is self.inner else ChangeSerde(inner)

    def serialize(self, change: Change | None) -> bytes | None:
        """The bytes of ``Change(new, old)``, each side with the inner serde; None stays None."""
        if change is None:
            return None
        s = self.inner.serialize
        return encode(None if change.new is None else s(change.new),
                      None if change.old is None else s(change.old))

    def deserialize(self, data: bytes | None) -> Change | None:
        """The ``Change(new, old)`` of the bytes; None stays None."""
        if data is None:
            return None
        new, old = decode(data)
        d = self.inner.deserialize
        return Change(None if new is None else d(new), None if old is None else d(old))

    def __repr__(self) -> str:
        return f"ChangeSerde({self.inner!r})"
