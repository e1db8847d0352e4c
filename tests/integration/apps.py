"""Topologies the integration tests start as separate worker processes (`processor run`)."""

import os

from processor import StreamsBuilder
from processor.serde import Serdes


def filter_topology():
    """orders (table) -> amount > 100 -> output; topic names from the environment."""
    b = StreamsBuilder()
    b.table(os.environ["APP_INPUT"], key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .filter(lambda k, v: v["amount"] > 100).to_stream().to(os.environ["APP_OUTPUT"])
    return b.build()
