"""Serdes: turn keys and values into bytes and back.

``None`` always maps to ``None`` (a tombstone or an absent key), in both directions.
JSON is canonical: sorted keys, compact separators, UTF-8, so equal values give equal bytes;
that is what lets emit-on-change compare values by their bytes.

Serdes raise plain exceptions; the runtime translates them at its boundary into
:class:`processor.errors.SerializationError` naming topic, partition, offset and step.

Compiled (docs/compiled.md): the JSON serde's per-record helpers are C functions there (the
digit-run test a C loop); the classes stay Python classes, open to subclasses and attributes.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import operator
import re
import struct
import uuid
from pathlib import Path
from typing import Any

import cython
import fastavro
import orjson

__all__ = ["Serde", "Serdes", "StringSerde", "JsonSerde", "BytesSerde", "AvroSerde", "LongSerde",
           "IntegerSerde", "ShortSerde", "FloatSerde", "DoubleSerde", "UUIDSerde"]


class Serde:
    """Base class: ``serialize(value) -> bytes | None`` and ``deserialize(bytes) -> value``."""

    name = "serde"

    def serialize(self, value: Any) -> bytes | None:  # pragma: no cover - abstract
        """The bytes of ``value`` (Kafka: ``Serializer#serialize``); None gives None.

        Args:
            value: The key or value.

        Returns:
            Its bytes, or None for None.
        """
        raise NotImplementedError

    def deserialize(self, data: bytes | None) -> Any:  # pragma: no cover - abstract
        """The value of ``data`` (Kafka: ``Deserializer#deserialize``); None gives None.

        Args:
            data: The bytes.

        Returns:
            The key or value, or None for None.
        """
        raise NotImplementedError

    def for_topic(self, topic: str, is_key: bool, config: dict | None = None) -> Serde:
        """This serde for the keys (``is_key``) or values of ``topic``, with the host's serde settings.

        Most serdes do not depend on their topic and return themselves (so binding costs
        nothing per record); a Schema Registry serde returns a copy bound to the topic's
        subject (``processor/serde/registry.py``). The ``Topology`` calls it for its sources,
        sinks and stores (``for_application``).

        Args:
            topic: The topic.
            is_key: For the topic's keys (else its values).
            config: The host's serde settings (Schema Registry settings).

        Returns:
            The serde to use for that topic.
        """
        return self

    def check(self, data: bytes | None) -> None:
        """Raises what ``deserialize`` raises on ``data``, else nothing.

        A serde that can tell without building the value does it faster (the backfill checks
        every record it compacts away this way).

        Args:
            data: The bytes.
        """
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
    """UTF-8 text (Kafka: ``Serdes.String()``)."""
    name = "string"

    def serialize(self, value: Any) -> bytes | None:
        """The UTF-8 bytes of a ``str``; None stays None (raises TypeError for another type)."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise TypeError(f"string serde expects str, got {type(value).__name__}")
        return value.encode("utf-8")

    def deserialize(self, data: bytes | None) -> Any:
        """The text of UTF-8 bytes; None stays None."""
        return None if data is None else data.decode("utf-8")


class BytesSerde(Serde):
    """Bytes as they are (Kafka: ``Serdes.ByteArray()``)."""
    name = "bytes"

    def serialize(self, value: Any) -> bytes | None:
        """``bytes``, ``bytearray`` or ``memoryview`` as bytes; None stays None (raises TypeError else)."""
        if value is None:
            return None
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"bytes serde expects bytes, got {type(value).__name__}")
        return bytes(value)

    def deserialize(self, data: bytes | None) -> Any:
        """The bytes themselves."""
        return data


_json_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False)
_json_decoder = json.JSONDecoder()
# orjson decodes to the same Python values as the standard library wherever it accepts the text,
# except integers beyond 64 bits (it returns floats): text with a run of 19 or more digits, and
# whatever orjson refuses (NaN, 1e400, lone surrogates...), is decided by the standard library
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_DIGITS = b"0123456789"


@cython.ccall
@cython.returns(cython.bint)
def _may_hold_long_integer(data: Any) -> bool:
    """Whether ``data`` has a run of 19 or more digits.

    Counting digits (one C pass) rules most text out faster than the regular expression scans it;
    compiled, one C loop over bytes decides.
    """
    if type(data) is bytes:
        if cython.compiled:
            return _digit_run(data)
        if len(data) - len(data.translate(None, _DIGITS)) < 19:
            return False
    return _LONG_DIGITS.search(data) is not None


@cython.cfunc
@cython.inline
@cython.returns(cython.bint)
@cython.locals(data=bytes, p=cython.p_char, n=cython.Py_ssize_t, run=cython.Py_ssize_t, i=cython.Py_ssize_t)
def _digit_run(data: Any) -> bool:
    """(Compiled only) whether ``data`` has 19 ASCII digits in a row.

    Its types are the decorators': the build ignores annotations (docs/compiled.md).
    """
    p = data
    n = len(data)
    run = 0
    for i in range(n):
        if 48 <= p[i] <= 57:
            run += 1
            if run == 19:
                return True
        else:
            run = 0
    return False


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


def _not_orjson(value: Any) -> Any:
    raise TypeError("left to the standard library")


@cython.ccall
def _encode_json(value: Any) -> bytes:
    try:
        data = orjson.dumps(value, _not_orjson, _ORJSON_OPTIONS)   # (default, option: positional, no kwargs dict)
    except (TypeError, orjson.JSONEncodeError):
        pass
    else:
        # (find, not ``in``: ``in`` on bytes first tries its operand as an int, and raises)
        if data.find(b"e-") < 0 and data.find(b"null") < 0 and data.find(b"0.0000") < 0:
            return data
    return _json_encoder.encode(value).encode("utf-8")


class JsonSerde(Serde):
    """Canonical JSON: sorted keys, compact, UTF-8, no NaN/Infinity.

    The standard library's bytes; enum members and UUIDs are written too (see ``_encode_json``).
    Kafka Streams has no JSON serde of its own; this one's bytes are what ``json.dumps(value,
    sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` writes.

    Example:
        >>> from processor.serde import Serdes
        >>> Serdes.json().serialize({"b": 1, "a": [1.5, None]})
        b'{"a":[1.5,null],"b":1}'
        >>> Serdes.json().deserialize(b'{"a":[1.5,null],"b":1}')
        {'a': [1.5, None], 'b': 1}
    """

    name = "json"

    def serialize(self, value: Any) -> bytes | None:
        """The canonical JSON bytes of ``value``; None stays None."""
        if value is None:
            return None
        return _encode_json(value)

    def deserialize(self, data: bytes | None) -> Any:
        """The value of JSON bytes; None stays None."""
        if data is None:
            return None
        if not _may_hold_long_integer(data):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        return _json_decoder.decode(bytes(data).decode("utf-8"))

    def check(self, data: bytes | None) -> None:
        """Raises what ``deserialize`` raises on ``data`` (short text checked without building it)."""
        if data is not None and len(data) < _CHECK_FAST_BELOW:
            try:
                orjson.loads(data)
                return
            except orjson.JSONDecodeError:
                pass
        self.deserialize(data)


_CHECK_FAST_BELOW = 512


SCHEMAS_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"



def load_schema(schema: Any) -> Any:
    """An Avro schema as JSON data.

    Args:
        schema: A parsed dict, a path to an ``.avsc`` file, or the name of a file in
            ``schemas/`` (``"order"`` or ``"order.avsc"``).

    Returns:
        The schema as JSON data (a dict).
    """
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

    def __init__(self, schema: Any, schema_id: int | None = None):
        schema = load_schema(schema)
        self.raw_schema = schema
        self.schema = fastavro.parse_schema(schema)
        self.schema_id = schema_id
        self._header = _CONFLUENT_HEADER.pack(0, schema_id) if schema_id is not None else b""

    def _identity(self) -> tuple:
        return (json.dumps(self.raw_schema, sort_keys=True), self.schema_id)

    def serialize(self, value: Any) -> bytes | None:
        """The Avro body of ``value`` (framed when ``schema_id`` is set); None stays None."""
        if value is None:
            return None
        buf = io.BytesIO()
        buf.write(self._header)
        fastavro.schemaless_writer(buf, self.schema, value)
        return buf.getvalue()

    def deserialize(self, data: bytes | None) -> Any:
        """The record of Avro bytes (checking the frame when ``schema_id`` is set); None stays None."""
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

    def __repr__(self) -> str:
        name = self.raw_schema.get("name", "?") if isinstance(self.raw_schema, dict) else "?"
        return f"Serdes.avro({name!r})"


# -- Kafka's number and UUID serdes ------------------------------------------------------------------
# The bytes of Kafka's own serializers (org.apache.kafka.common.serialization), so a topic written by
# a Java application reads here and the other way round. None <-> no bytes (a tombstone), as there.
# A value of another size is refused (Kafka's deserializers: "Size of data received by
# LongDeserializer is not 8"): the runtime makes it a DeserializationError naming the record and the
# step, under the on-error policy.


def _integral(value: Any, serde: Serde) -> int:
    """``value`` as a Python int for ``serde``, never a bool.

    An int or anything with ``__index__`` (numpy's integers too); Kafka's serializers are typed
    (a Boolean is no Long).
    """
    if isinstance(value, bool):
        raise TypeError(f"{serde.name} serde expects int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{serde.name} serde expects int, got {type(value).__name__}") from None


class _FixedWidthSerde(Serde):
    """A value as exactly ``size`` bytes (``_struct``, big-endian)."""

    size = 0
    java = ""
    _struct: struct.Struct   # (a class attribute: the serde pickles as its class alone)

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if len(data) != self.size:
            raise ValueError(f"{self.name} serde expects exactly {self.size} bytes (Kafka's "
                             f"{self.java}Deserializer), got {len(data)}")
        return self._struct.unpack(data)[0]

    def check(self, data: bytes | None) -> None:
        if data is not None and len(data) != self.size:
            self.deserialize(data)


class _IntegerSerde(_FixedWidthSerde):
    """Two's complement, big-endian, ``size`` bytes (Kafka's Long/Integer/ShortSerializer)."""

    _lo = _hi = 0

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        n = _integral(value, self)
        if not self._lo <= n <= self._hi:
            raise ValueError(f"{self.name} serde: {n} is out of range [{self._lo}, {self._hi}] "
                             f"({8 * self.size}-bit two's complement)")
        return self._struct.pack(n)


class LongSerde(_IntegerSerde):
    """8 bytes, big-endian two's complement (Java ``long``; Kafka: ``Serdes.Long()``).

    1 -> ``00 00 00 00 00 00 00 01``, -1 -> ``ff ff ff ff ff ff ff ff``, -2**63 ->
    ``80 00 00 00 00 00 00 00``.

    Example:
        >>> from processor.serde import Serdes
        >>> Serdes.long().serialize(258).hex()
        '0000000000000102'
        >>> Serdes.long().deserialize(bytes.fromhex("ffffffffffffffff"))
        -1
    """

    name, size, java, _struct = "long", 8, "Long", struct.Struct(">q")
    _lo, _hi = -(1 << 63), (1 << 63) - 1


class IntegerSerde(_IntegerSerde):
    """4 bytes, big-endian two's complement (Java ``int``; Kafka: ``Serdes.Integer()``).

    258 -> ``00 00 01 02``, -2 -> ``ff ff ff fe``.
    """

    name, size, java, _struct = "integer", 4, "Integer", struct.Struct(">i")
    _lo, _hi = -(1 << 31), (1 << 31) - 1


class ShortSerde(_IntegerSerde):
    """2 bytes, big-endian two's complement (Java ``short``; Kafka: ``Serdes.Short()``): 1 -> ``00 01``."""

    name, size, java, _struct = "short", 2, "Short", struct.Struct(">h")
    _lo, _hi = -(1 << 15), (1 << 15) - 1


class _FloatingSerde(_FixedWidthSerde):
    """IEEE 754, big-endian.

    Takes a float or an int (not a bool); every NaN is written as Java's canonical NaN
    (``nan_bytes``), so equal values give equal bytes.
    """

    nan_bytes = b""

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{self.name} serde expects float, got {type(value).__name__}")
        value = float(value)
        if math.isnan(value):
            return self.nan_bytes
        try:
            return self._struct.pack(value)
        except OverflowError:
            raise ValueError(f"{self.name} serde: {value!r} is beyond the range of a "
                             f"{8 * self.size}-bit float") from None


class FloatSerde(_FloatingSerde):
    """4 bytes, IEEE 754 binary32, big-endian (Java ``float``; Kafka: ``Serdes.Float()``).

    As ``Float.floatToRawIntBits``: 1.0 -> ``3f 80 00 00``, -2.5 -> ``c0 20 00 00``; NaN ->
    ``7f c0 00 00`` (``Float.NaN``). A Python float is rounded to the nearest binary32 (0.1
    reads back as 0.10000000149011612); a finite value beyond binary32's range is refused, not
    written as infinity.
    """

    name, size, java, _struct = "float", 4, "Float", struct.Struct(">f")
    nan_bytes = b"\x7f\xc0\x00\x00"


class DoubleSerde(_FloatingSerde):
    """8 bytes, IEEE 754 binary64, big-endian (Java ``double``; Kafka: ``Serdes.Double()``).

    As ``Double.doubleToLongBits``: 1.0 -> ``3f f0 00 00 00 00 00 00``; NaN ->
    ``7f f8 00 00 00 00 00 00`` (Java's canonical NaN).
    """

    name, size, java, _struct = "double", 8, "Double", struct.Struct(">d")
    nan_bytes = b"\x7f\xf8" + bytes(6)


_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")


class UUIDSerde(Serde):
    """A ``uuid.UUID`` as the UTF-8 bytes of its 36-character string (Kafka: ``Serdes.UUID()``).

    As ``UUID.toString()``: lower-case ``8-4-4-4-12`` hex, e.g.
    ``b"123e4567-e89b-12d3-a456-426614174000"``. Reading accepts that form in either case; anything
    else (another length, other characters, not UTF-8) is refused. Java's ``UUID.fromString``
    also takes shortened groups (``"1-2-3-4-5"``), which Java's serializer never writes; they are
    refused here.
    """

    name = "uuid"

    def serialize(self, value: Any) -> bytes | None:
        """The text of a ``uuid.UUID`` as bytes; None stays None (raises TypeError for another type)."""
        if value is None:
            return None
        if not isinstance(value, uuid.UUID):
            raise TypeError(f"uuid serde expects uuid.UUID, got {type(value).__name__}")
        return str(value).encode("ascii")

    def deserialize(self, data: bytes | None) -> Any:
        """The ``uuid.UUID`` of its text's bytes; None stays None (raises ValueError for another text)."""
        if data is None:
            return None
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("uuid serde: the bytes are not UTF-8") from None
        if _UUID_TEXT.match(text) is None:
            raise ValueError(f"uuid serde: {text[:60]!r} is not a UUID (8-4-4-4-12 hex digits)")
        return uuid.UUID(text)


class Serdes:
    """The serdes by name, as Kafka Streams' ``Serdes`` factory.

    ``Serdes.string()``, ``.json()``, ``.bytes()``, ``.avro(schema)``, ``.avro(schema,
    registry=url)``, and Kafka's ``.long()``, ``.integer()``, ``.short()``, ``.float()``,
    ``.double()``, ``.uuid()`` (their byte layouts are next to their classes). Pass them as
    ``key_serde=``/``value_serde=`` to sources, sinks and operators.

    Example:
        >>> from processor import StreamsBuilder
        >>> from processor.serde import Serdes
        >>> from processor.testing import TopologyTestDriver
        >>> builder = StreamsBuilder()
        >>> amounts = builder.stream("amounts", key_serde=Serdes.string(), value_serde=Serdes.long())
        >>> amounts.map_values(lambda cents: cents / 100, value_serde=Serdes.double()).to("euros")
        >>> with TopologyTestDriver(builder.build()) as driver:
        ...     driver.pipe_raw("amounts", b"a", Serdes.long().serialize(250), timestamp=1)
        ...     driver.read_output("euros")[0].value
        2.5
        >>> Serdes.string().serialize("Oslo")
        b'Oslo'
    """

    _string = StringSerde()
    _json = JsonSerde()
    _bytes = BytesSerde()
    _long = LongSerde()
    _integer = IntegerSerde()
    _short = ShortSerde()
    _float = FloatSerde()
    _double = DoubleSerde()
    _uuid = UUIDSerde()

    @staticmethod
    def string() -> StringSerde:
        """UTF-8 text (Kafka: ``Serdes.String()``); the default key serde."""
        return Serdes._string

    @staticmethod
    def json() -> JsonSerde:
        """Canonical JSON (``JsonSerde``); the default value serde."""
        return Serdes._json

    @staticmethod
    def bytes() -> BytesSerde:
        """Bytes as they are (Kafka: ``Serdes.ByteArray()``)."""
        return Serdes._bytes

    @staticmethod
    def long() -> LongSerde:
        """Kafka's LongSerde: 8 bytes, big-endian two's complement."""
        return Serdes._long

    @staticmethod
    def integer() -> IntegerSerde:
        """Kafka's IntegerSerde: 4 bytes, big-endian two's complement."""
        return Serdes._integer

    @staticmethod
    def short() -> ShortSerde:
        """Kafka's ShortSerde: 2 bytes, big-endian two's complement."""
        return Serdes._short

    @staticmethod
    def float() -> FloatSerde:
        """Kafka's FloatSerde: 4 bytes, IEEE 754 binary32, big-endian."""
        return Serdes._float

    @staticmethod
    def double() -> DoubleSerde:
        """Kafka's DoubleSerde: 8 bytes, IEEE 754 binary64, big-endian."""
        return Serdes._double

    @staticmethod
    def uuid() -> UUIDSerde:
        """Kafka's UUIDSerde: a ``uuid.UUID`` as its 36-character string's UTF-8 bytes."""
        return Serdes._uuid

    @staticmethod
    def avro(schema: Any, schema_id: int | None = None, *, registry: Any = None,
             auto_register: bool | None = None) -> Serde:
        """Avro, with a fixed schema or through a Schema Registry (Confluent's ``KafkaAvroSerde``).

        Args:
            schema: The reader's schema: a parsed dict, a path to an ``.avsc`` file, or the name
                of a file in ``schemas/``.
            schema_id: Without ``registry``: frame the bytes with this fixed schema id.
            registry: A URL, ``mock://...`` for the client library's in-memory registry, a dict
                of Schema Registry client settings, or a ``SchemaRegistryClient``: writers'
                schemas resolved by id and read into ``schema``, written under the topic's
                subject (``processor/serde/registry.py``).
            auto_register: Register the schema when writing (None: the host's
                ``auto.register.schemas``, else on).

        Returns:
            An ``AvroSerde`` (no registry) or a ``RegistryAvroSerde``.

        Raises:
            ValueError: ``auto_register`` without a registry, or ``schema_id`` with one.
        """
        if registry is None:
            if auto_register is not None:
                raise ValueError("auto_register needs a registry")
            return AvroSerde(schema, schema_id)
        if schema_id is not None:
            raise ValueError("schema_id is for the fixed-schema serde; with a registry the id is the registry's")
        from processor.serde.registry import RegistryAvroSerde

        return RegistryAvroSerde(schema, registry, auto_register)

    @staticmethod
    def session_windowed(inner: Serde) -> Serde:
        """Keys of a session-windowed aggregate (Kafka Streams: ``SessionWindowedSerde``).

        Layout: ``{inner key bytes}{8-byte BE end}{8-byte BE start}``.

        Args:
            inner: The grouping key's serde.

        Returns:
            The serde of ``Windowed(key, start, end)`` keys.
        """
        from processor.serde.windowed import SessionWindowedSerde

        return SessionWindowedSerde(inner)

    @staticmethod
    def windowed(inner: Serde, size_ms: int) -> Serde:
        """Keys of a time-windowed aggregate (Kafka Streams: ``TimeWindowedSerde``).

        Layout: ``{inner key bytes}{8-byte BE window start}``.

        Args:
            inner: The grouping key's serde.
            size_ms: The windows' size (the end is start + size).

        Returns:
            The serde of ``Windowed(key, start, end)`` keys.
        """
        from processor.serde.windowed import WindowedSerde

        return WindowedSerde(inner, size_ms)
