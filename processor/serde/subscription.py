"""Foreign-key join wire and store formats (contracts; KIP-213).

Subscription record (left -> right), on ``<app>-<join>-subscription-registration-topic``,
key = the foreign key in the RIGHT table's key bytes (so it lands on the partition that holds
that right row), value::

    {version = 1}{instruction}{4-byte BE primary partition}{8-byte BE left version}{pk bytes}

    instruction 0x00 UNSUBSCRIBE                   drop the subscription, respond nothing
                0x01 SUBSCRIBE_AND_RESPOND         store it, respond with the right row or null
                0x02 SUBSCRIBE_RESPOND_IF_PRESENT  store it, respond only if the right row exists
                                                   (inner join whose result is absent: a null
                                                   response could change nothing)

Response record (right -> left), on ``<app>-<join>-subscription-response-topic``, sent to the
primary partition explicitly, key = the primary key bytes, value::

    {version = 1}{flags}{8-byte BE left version}{right value bytes}
    flags: bit 0 = the right row exists (clear: no value bytes)

Both carry the header ``processor.source`` (``processor/provenance.py``): a subscription names
the left input record that caused it (its topic, partition and offset); a response names the
right-side input record that caused it. A response also echoes the subscription's header as
``processor.fk.subscription``, so the left record it answers can be traced.

Subscription store (right side, column family ``<join>-subscription-store``): key
``CombinedKey(fk, pk)`` (``processor/state/combined_key.py``), value::

    {version = 1}{4-byte BE primary partition}{8-byte BE left version}{echo header bytes}

Left version store (left side, column family ``<join>-version-store``): key = pk bytes, value
``{version = 1}{8-byte BE left version}``: the version of the left row a response must answer
to be applied (the high-water mark per primary key; every older response is dropped).

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

_SUB = struct.Struct(">BBiq")
_RESP = struct.Struct(">BBq")
_STORE = struct.Struct(">Biq")
_VER = struct.Struct(">Bq")
_PRESENT = 1


def _check_version(what, v):
    if v != VERSION:
        raise ValueError(f"unknown {what} version {v} (this build reads {VERSION})")


class Subscription(NamedTuple):
    instruction: int
    primary_partition: int
    version: int
    pk: bytes


def encode_subscription(instruction: int, primary_partition: int, version: int, pk: bytes) -> bytes:
    if instruction not in INSTRUCTIONS:
        raise ValueError(f"unknown subscription instruction {instruction:#04x}")
    return _SUB.pack(VERSION, instruction, primary_partition, version) + pk


def decode_subscription(data: bytes) -> Subscription:
    if data is None or len(data) < _SUB.size:
        raise ValueError(f"subscription value too short ({0 if data is None else len(data)} bytes)")
    v, instr, part, version = _SUB.unpack_from(data)
    _check_version("subscription", v)
    if instr not in INSTRUCTIONS:
        raise ValueError(f"unknown subscription instruction {instr:#04x}")
    return Subscription(instr, part, version, data[_SUB.size:])


class Response(NamedTuple):
    version: int
    value: bytes | None   # the right row's value bytes; None: no right row


def encode_response(version: int, value: bytes | None) -> bytes:
    head = _RESP.pack(VERSION, _PRESENT if value is not None else 0, version)
    return head if value is None else head + value


def decode_response(data: bytes) -> Response:
    if data is None or len(data) < _RESP.size:
        raise ValueError(f"response value too short ({0 if data is None else len(data)} bytes)")
    v, flags, version = _RESP.unpack_from(data)
    _check_version("response", v)
    if flags & ~_PRESENT:
        raise ValueError(f"unknown response flags {flags:#04x}")
    if flags & _PRESENT:
        return Response(version, data[_RESP.size:])
    if len(data) != _RESP.size:
        raise ValueError("a response without a right row carries value bytes")
    return Response(version, None)


class Subscriber(NamedTuple):
    primary_partition: int
    version: int
    echo: bytes


def encode_subscriber(primary_partition: int, version: int, echo: bytes | None) -> bytes:
    return _STORE.pack(VERSION, primary_partition, version) + (echo or b"")


def decode_subscriber(data: bytes) -> Subscriber:
    if len(data) < _STORE.size:
        raise ValueError(f"subscription store value too short ({len(data)} bytes)")
    v, part, version = _STORE.unpack_from(data)
    _check_version("subscription store value", v)
    return Subscriber(part, version, data[_STORE.size:])


def encode_left_version(version: int) -> bytes:
    return _VER.pack(VERSION, version)


def decode_left_version(data: bytes) -> int:
    if len(data) != _VER.size:
        raise ValueError(f"left version entry has {len(data)} bytes, expected {_VER.size}")
    v, version = _VER.unpack(data)
    _check_version("left version entry", v)
    return version
