"""Serdes: turn keys and values into bytes and back.

``None`` always maps to ``None`` (a tombstone or an absent key), in both directions.
JSON is canonical: sorted keys, compact separators, UTF-8, so equal values give equal bytes;
that is what lets emit-on-change compare values by their bytes.

Serdes raise plain exceptions; the runtime translates them at its boundary into
:class:`processor.errors.SerializationError` naming topic, partition, offset and step.
"""

from __future__ import annotations

import io
import json
import re
import struct
from pathlib import Path
from typing import Any

import fastavro
import orjson

__all__ = ["Serde", "Serdes", "StringSerde", "JsonSerde", "BytesSerde", "AvroSerde"]


class Serde:
    """Base class: ``serialize(value) -> bytes | None`` and ``deserialize(bytes) -> value``."""

    name = "serde"

    def serialize(self, value: Any) -> bytes | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def deserialize(self, data: bytes | None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> "Serde":
        """This serde for the keys (``is_key``) or values of ``topic``, with the host's serde
        settings ``config`` (Schema Registry settings). Most serdes do not depend on their topic
        and return themselves (so binding costs nothing per record); a Schema Registry serde
        returns a copy bound to the topic's subject (``processor/serde/registry.py``). The
        ``Topology`` calls it for its sources, sinks and stores (``for_application``)."""
        return self

    def check(self, data: bytes | None) -> None:
        """Raise what ``deserialize`` raises on ``data``, else nothing: a serde that can tell
        without building the value does it faster (the backfill checks every record it
        compacts away this way)."""
        self.deserialize(data)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash((type(self), self._identity()))

    def _identity(self) -> tuple:
        return ()

    def __repr__(self) -> str:
        return f"Serdes.{self.name}()"


class StringSerde(Serde):
    name = "string"

    def serialize(self, value):
        if value is None:
            return None
        if not isinstance(value, str):
            raise TypeError(f"string serde expects str, got {type(value).__name__}")
        return value.encode("utf-8")

    def deserialize(self, data):
        return None if data is None else data.decode("utf-8")


class BytesSerde(Serde):
    name = "bytes"

    def serialize(self, value):
        if value is None:
            return None
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"bytes serde expects bytes, got {type(value).__name__}")
        return bytes(value)

    def deserialize(self, data):
        return data


_json_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False)
_json_decoder = json.JSONDecoder()
# orjson decodes to the same Python values as the standard library wherever it accepts the text,
# except integers beyond 64 bits (it returns floats): text with a run of 19 or more digits, and
# whatever orjson refuses (NaN, 1e400, lone surrogates...), is decided by the standard library
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_DIGITS = b"0123456789"


def _may_hold_long_integer(data) -> bool:
    """Whether ``data`` has a run of 19 or more digits. Counting digits (one C pass) rules most
    text out faster than the regular expression scans it."""
    if type(data) is bytes and len(data) - len(data.translate(None, _DIGITS)) < 19:
        return False
    return _LONG_DIGITS.search(data) is not None


# Encoding: orjson writes the standard library's canonical bytes (sorted keys, compact, UTF-8)
# for every value both accept, except for floats below 1e-4 in magnitude (``0.00001`` for
# ``1e-05``, ``1.5e-7`` for ``1.5e-07``) and NaN/Infinity (``null`` where the standard library
# refuses). Its output is kept unless it holds ``e-``, ``0.0000`` or ``null`` (every such float
# writes one of these: checked over 2M random floats); then, and for whatever orjson refuses
# (integers beyond 64 bits, non-string keys, subclasses of built-in types, dataclasses, dates),
# the standard library decides, so the bytes and the errors are its own. One difference, on
# purpose: enum members and UUIDs, which the standard library refuses, are written (an enum as its
# value, a UUID as its canonical string), as orjson writes them, and so is an ``orjson.Fragment``.
_ORJSON_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                   | orjson.OPT_PASSTHROUGH_DATETIME)


def _not_orjson(value):
    raise TypeError("left to the standard library")


def _encode_json(value) -> bytes:
    try:
        data = orjson.dumps(value, default=_not_orjson, option=_ORJSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        pass
    else:
        if b"e-" not in data and b"null" not in data and b"0.0000" not in data:
            return data
    return _json_encoder.encode(value).encode("utf-8")


class JsonSerde(Serde):
    """Canonical JSON: sorted keys, compact, UTF-8, no NaN/Infinity (the standard library's
    bytes; enum members and UUIDs are written too: see ``_encode_json``)."""

    name = "json"

    def serialize(self, value):
        if value is None:
            return None
        return _encode_json(value)

    def deserialize(self, data):
        if data is None:
            return None
        if not _may_hold_long_integer(data):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        return _json_decoder.decode(bytes(data).decode("utf-8"))

    def check(self, data):
        # Text orjson accepts is JSON the standard library accepts too, but for nesting deeper
        # than its recursion limit allows, which text shorter than _CHECK_FAST_BELOW cannot hold.
        if data is not None and len(data) < _CHECK_FAST_BELOW:
            try:
                orjson.loads(data)
                return
            except orjson.JSONDecodeError:
                pass
        self.deserialize(data)


_CHECK_FAST_BELOW = 512


SCHEMAS_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"



def load_schema(schema):
    """An Avro schema given as a parsed dict, a path to an ``.avsc`` file, or the name of a file
    in ``schemas/`` (``"order"`` or ``"order.avsc"``) -> the schema as JSON data."""
    if isinstance(schema, (str, Path)):
        path = Path(schema)
        if not path.exists():
            name = str(schema) if str(schema).endswith(".avsc") else f"{schema}.avsc"
            path = SCHEMAS_DIR / name
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    return schema


# Confluent wire format: magic byte 0, 4-byte big-endian schema id, then the Avro body.
_CONFLUENT_HEADER = struct.Struct(">bI")


class AvroSerde(Serde):
    """Avro through fastavro, schemaless body, optionally in Confluent wire framing.

    ``schema`` is a parsed schema dict, a path to an ``.avsc`` file, or the name of a file in
    ``schemas/`` (``"order"`` or ``"order.avsc"``). With ``schema_id`` set, bytes are framed as
    ``{0x00}{4-byte BE schema id}{body}`` and a frame with another magic byte or id is rejected.
    """

    name = "avro"

    def __init__(self, schema, schema_id: int | None = None):
        schema = load_schema(schema)
        self.raw_schema = schema
        self.schema = fastavro.parse_schema(schema)
        self.schema_id = schema_id
        self._header = _CONFLUENT_HEADER.pack(0, schema_id) if schema_id is not None else b""

    def _identity(self):
        return (json.dumps(self.raw_schema, sort_keys=True), self.schema_id)

    def serialize(self, value):
        if value is None:
            return None
        buf = io.BytesIO()
        buf.write(self._header)
        fastavro.schemaless_writer(buf, self.schema, value)
        return buf.getvalue()

    def deserialize(self, data):
        if data is None:
            return None
        buf = io.BytesIO(data)
        if self.schema_id is not None:
            if len(data) < 5:
                raise ValueError(f"Confluent frame too short ({len(data)} bytes)")
            magic, sid = _CONFLUENT_HEADER.unpack_from(data)
            if magic != 0:
                raise ValueError(f"unknown Confluent magic byte {magic} (expected 0)")
            if sid != self.schema_id:
                raise ValueError(f"schema id {sid} does not match the serde's schema id {self.schema_id}")
            buf.seek(5)
        value = fastavro.schemaless_reader(buf, self.schema, None)
        if buf.tell() != len(data):
            raise ValueError(f"{len(data) - buf.tell()} trailing bytes after the Avro record")
        return value

    def __repr__(self):
        name = self.raw_schema.get("name", "?") if isinstance(self.raw_schema, dict) else "?"
        return f"Serdes.avro({name!r})"


class Serdes:
    """Factory, as in Kafka Streams: ``Serdes.string()``, ``.json()``, ``.bytes()``, ``.avro(schema)``,
    ``.avro(schema, registry=url)``."""

    _string = StringSerde()
    _json = JsonSerde()
    _bytes = BytesSerde()

    @staticmethod
    def string() -> StringSerde:
        return Serdes._string

    @staticmethod
    def json() -> JsonSerde:
        return Serdes._json

    @staticmethod
    def bytes() -> BytesSerde:
        return Serdes._bytes

    @staticmethod
    def avro(schema, schema_id: int | None = None, *, registry=None, auto_register: bool | None = None):
        """Avro. Without ``registry``: one fixed schema, optionally framed with a fixed
        ``schema_id`` (``AvroSerde``). With ``registry`` (a URL, ``mock://...`` for the client
        library's in-memory registry, a dict of Schema Registry client settings, or a
        ``SchemaRegistryClient``): writers' schemas resolved by id and read into ``schema``,
        written under the topic's subject, registered when ``auto_register`` (None: the host's
        ``auto.register.schemas``, else on) (``processor/serde/registry.py``)."""
        if registry is None:
            if auto_register is not None:
                raise ValueError("auto_register needs a registry")
            return AvroSerde(schema, schema_id)
        if schema_id is not None:
            raise ValueError("schema_id is for the fixed-schema serde; with a registry the id is the registry's")
        from processor.serde.registry import RegistryAvroSerde

        return RegistryAvroSerde(schema, registry, auto_register)

    @staticmethod
    def session_windowed(inner: Serde):
        """Keys of a session-windowed aggregate: ``{inner key bytes}{8-byte BE end}{8-byte BE start}``."""
        from processor.serde.windowed import SessionWindowedSerde

        return SessionWindowedSerde(inner)

    @staticmethod
    def windowed(inner: Serde, size_ms: int):
        """Keys of a windowed aggregate: ``{inner key bytes}{8-byte BE window start}``."""
        from processor.serde.windowed import WindowedSerde

        return WindowedSerde(inner, size_ms)
