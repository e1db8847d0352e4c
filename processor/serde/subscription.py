"""Foreign-key join wire and store formats (contracts; KIP-213).

Subscription record (left -> right), on ``<app>-<join>-subscription-registration-topic``,
key = the foreign key in the RIGHT table's key bytes (so it lands on the partition that holds
that right row), value::

    {version = 1}{instruction}{4-byte BE primary partition}{pk bytes}

    instruction 0x00 UNSUBSCRIBE                   drop the subscription, respond nothing
                0x01 SUBSCRIBE_AND_RESPOND         store it, respond with the right row or null
                0x02 SUBSCRIBE_RESPOND_IF_PRESENT  store it, respond only if the right row exists
                                                   (inner join whose result is absent: a null
                                                   response could change nothing)

and the header ``processor.source`` (``processor/provenance.py``): the topic, partition and
offset of the left input record that caused it (plus a sequence number). That header IS the
left row's version: the left side keeps it per primary key, the right side stores it with the
subscription, and every response echoes it.

Response record (right -> left), on ``<app>-<join>-subscription-response-topic``, sent to the
primary partition explicitly, key = the primary key bytes, value::

    {version = 1}{flags}{4-byte BE fk length}{fk bytes}{right value bytes}
    flags: bit 0 = the right row exists (clear: no value bytes)

with the header ``processor.fk.subscription`` = the ``processor.source`` header of the
subscription it answers (the echo), and its own ``processor.source`` (the right-side input
record that caused it: the subscription, or a right-table update).

Subscription store (right side, column family ``<join>-subscription-store``): key
``CombinedKey(fk, pk)`` (``processor/state/combined_key.py``), value::

    {version = 1}{4-byte BE primary partition}{echo: the subscription's processor.source bytes}

Left version store (left side, column family ``<join>-version-store``): key = pk bytes, value
``{version = 1}{processor.source bytes of the latest left version}``: the high-water mark per
primary key. A response is applied only if its echo equals it AND its foreign key is the
current row's; every response to an older version is dropped.

Unknown versions and instruction codes are rejected loudly.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

VERSION = 1
ECHO_HEADER = "processor.fk.subscription"

UNSUBSCRIBE = 0x00
SUBSCRIBE_AND_RESPOND = 0x01
SUBSCRIBE_RESPOND_IF_PRESENT = 0x02
INSTRUCTIONS = {UNSUBSCRIBE: "UNSUBSCRIBE", SUBSCRIBE_AND_RESPOND: "SUBSCRIBE_AND_RESPOND",
                SUBSCRIBE_RESPOND_IF_PRESENT: "SUBSCRIBE_RESPOND_IF_PRESENT"}

_SUB = struct.Struct(">BBi")
_RESP = struct.Struct(">BBI")
_STORE = struct.Struct(">Bi")
_PRESENT = 1


def _check_version(what: str, v: int) -> None:
    if v != VERSION:
        raise ValueError(f"unknown {what} version {v} (this build reads {VERSION})")


class Subscription(NamedTuple):
    """A decoded subscription: what the left side asks of the right (instruction, its partition, its key)."""
    instruction: int
    primary_partition: int
    pk: bytes


def encode_subscription(instruction: int, primary_partition: int, pk: bytes) -> bytes:
    """The bytes of a subscription (the layout is this module's)."""
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"unknown subscription instruction {instruction:#04x}")
    return _SUB.pack(VERSION, instruction, primary_partition) + pk


def decode_subscription(data: bytes) -> Subscription:
    """The subscription of its bytes (raises ValueError for bytes of another version or layout)."""
    if data is None or len(data) < _SUB.size:
        raise ValueError(f"subscription value too short ({0 if data is None else len(data)} bytes)")
    v, instr, part = _SUB.unpack_from(data)
    _check_version("subscription", v)
    if instr not in INSTRUCTIONS:
        raise ValueError(f"unknown subscription instruction {instr:#04x}")
    return Subscription(instr, part, data[_SUB.size:])


def subscription_pk(data: bytes | None) -> bytes | None:
    """The primary key of a subscription record this build writes (None: it is not one)."""
    if data is None or len(data) < _SUB.size or data[0] != VERSION or data[1] not in INSTRUCTIONS:
        return None
    return data[_SUB.size:]


class Response(NamedTuple):
    """A decoded response: the foreign key it is about and the right row's value bytes."""
    fk: bytes             # the foreign key (right key bytes) this response is about
    value: bytes | None   # the right row's value bytes; None: no right row


def encode_response(fk: bytes, value: bytes | None) -> bytes:
    """The bytes of a response (the layout is this module's)."""
    head = _RESP.pack(VERSION, _PRESENT if value is not None else 0, len(fk)) + fk
    return head if value is None else head + value


def decode_response(data: bytes) -> Response:
    """The response of its bytes (raises ValueError for bytes of another version or layout)."""
    if data is None or len(data) < _RESP.size:
        raise ValueError(f"response value too short ({0 if data is None else len(data)} bytes)")
    v, flags, n = _RESP.unpack_from(data)
    _check_version("response", v)
    if flags & ~_PRESENT:
        raise ValueError(f"unknown response flags {flags:#04x}")
    end = _RESP.size + n
    if end > len(data):
        raise ValueError(f"response declares a {n}-byte foreign key but has {len(data) - _RESP.size} bytes")
    fk = data[_RESP.size:end]
    if flags & _PRESENT:
        return Response(fk, data[end:])
    if len(data) != end:
        raise ValueError("a response without a right row carries value bytes")
    return Response(fk, None)


class Subscriber(NamedTuple):
    """A subscription store entry: the left partition to respond to and the echoed left version."""
    primary_partition: int
    echo: bytes           # the subscription's processor.source header: the left version


def encode_subscriber(primary_partition: int, echo: bytes) -> bytes:
    """The bytes of a subscription store entry."""
    return _STORE.pack(VERSION, primary_partition) + echo


def decode_subscriber(data: bytes) -> Subscriber:
    """The subscription store entry of its bytes (raises ValueError for another version)."""
    if len(data) < _STORE.size:
        raise ValueError(f"subscription store value too short ({len(data)} bytes)")
    v, part = _STORE.unpack_from(data)
    _check_version("subscription store value", v)
    return Subscriber(part, data[_STORE.size:])


def encode_left_version(source: bytes) -> bytes:
    """The bytes of a left version entry (the key's latest ``processor.source`` bytes)."""
    return bytes([VERSION]) + source


def decode_left_version(data: bytes) -> bytes:
    """The ``processor.source`` bytes of the key's latest left version."""
    if not data:
        raise ValueError("empty left version entry")
    _check_version("left version entry", data[0])
    return data[1:]
