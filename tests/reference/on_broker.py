"""Topologies for ``processor run`` on a broker beside Kafka Streams applications.

``tests.reference.on_broker:topology`` builds the Python twin named by ``$REFERENCE_TWIN`` with
the parameters in ``$REFERENCE_PARAMS`` (JSON), so a run on a broker and the Kafka Streams
application of its Java twin (``java/StreamsApp.java``) read the same topics (the parameters'
``prefix`` names them).

``tests.reference.on_broker:reader`` reads topics another application wrote, as
``java/InteropReader.java`` does in Kafka Streams: ``$REFERENCE_PARAMS``'s ``topics``
(``{source: {"key": serde, "value": serde, "out": topic}}``), each record written to ``out`` as
text, timestamps kept; a windowed key's text is ``key@start-end``, a null stays null."""

from __future__ import annotations

import json
import os
from typing import Any

from processor import StreamsBuilder
from processor.records import Windowed
from processor.serde import Serdes
from processor.serde.windowed import SessionWindowedSerde
from processor.topology import Topology
from tests.reference.twins import TWINS, windowed_key

READ_SERDES = {"string": Serdes.string, "integer": Serdes.integer, "long": Serdes.long, "double": Serdes.double,
               "windowed10": lambda: Serdes.windowed(Serdes.string(), 10),
               "session": lambda: SessionWindowedSerde(Serdes.string())}


def topology() -> Topology:
    return TWINS[os.environ["REFERENCE_TWIN"]].build(json.loads(os.environ["REFERENCE_PARAMS"]))


def text(o: Any) -> str | None:
    """As ``InteropReader.text``: Java's ``String.valueOf`` of the numbers this suite writes
    (Python's ``str`` of a float agrees with it only between 1e-3 and 1e7: the interop test's
    doubles are 0 to 13.5)."""
    if o is None:
        return None
    if isinstance(o, Windowed):
        return windowed_key(o, None)[0]
    return str(o)


def reader() -> Topology:
    b = StreamsBuilder()
    for source, t in json.loads(os.environ["REFERENCE_PARAMS"])["topics"].items():
        b.stream(source, key_serde=READ_SERDES[t["key"]](), value_serde=READ_SERDES[t["value"]]()).map(
            lambda k, v: (text(k), text(v))).to(t["out"], Serdes.string(), Serdes.string())
    return b.build()
