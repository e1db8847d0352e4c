"""A twin for ``processor run``: ``tests.reference.on_broker:topology`` builds the Python twin
named by ``$REFERENCE_TWIN`` with the parameters in ``$REFERENCE_PARAMS`` (JSON), so a run on a
broker and the Kafka Streams application of its Java twin (``java/StreamsApp.java``) read the
same topics (the parameters' ``prefix`` names them)."""

from __future__ import annotations

import json
import os

from processor.topology import Topology
from tests.reference.twins import TWINS


def topology() -> Topology:
    return TWINS[os.environ["REFERENCE_TWIN"]].build(json.loads(os.environ["REFERENCE_PARAMS"]))
