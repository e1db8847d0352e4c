"""CombinedKey codec for foreign-key joins (a contract).

Layout::

    {4-byte big-endian length of fk}{fk bytes}{pk bytes}

The subscription store of a foreign-key join is keyed by CombinedKey so that every subscriber
of one foreign key is found by a prefix scan on ``{fk length}{fk bytes}``. The length prefix is
what keeps the scan for ``ab`` from matching a foreign key ``abc``.
"""

from __future__ import annotations

import struct

_LEN = struct.Struct(">I")


def encode(fk: bytes, pk: bytes) -> bytes:
    return _LEN.pack(len(fk)) + fk + pk


def prefix(fk: bytes) -> bytes:
    """The prefix shared by every CombinedKey of ``fk`` and by no other foreign key's."""
    return _LEN.pack(len(fk)) + fk


def decode(data: bytes) -> tuple[bytes, bytes]:
    if len(data) < 4:
        raise ValueError(f"CombinedKey too short ({len(data)} bytes)")
    (n,) = _LEN.unpack_from(data)
    if 4 + n > len(data):
        raise ValueError(f"CombinedKey declares a {n}-byte foreign key but has {len(data) - 4} bytes")
    return data[4:4 + n], data[4 + n:]
