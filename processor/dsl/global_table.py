"""``GlobalKTable``: a table every host holds whole (``StreamsBuilder.global_table``).

Streams join it through a key selector (``KStream.join(global_table, joiner, key_selector=fn)``).
"""

from __future__ import annotations

from processor.serde import Serde


class GlobalKTable:
    """A table every host holds whole (Kafka Streams: ``GlobalKTable``).

    What ``StreamsBuilder.global_table`` returns: the name of its global store, its topic and
    serdes. Only a stream join reads it (Kafka Streams: a GlobalKTable has no operators).

    Attributes:
        store_name: The global store's name.
        topic: The topic it is read from.
        key_serde: Its key serde.
        value_serde: Its value serde.
    """

    dsl_kind = "global-table"

    def __init__(self, store_name: str, topic: str, key_serde: Serde, value_serde: Serde):
        self.store_name = store_name
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde

    def __repr__(self) -> str:
        return f"GlobalKTable({self.store_name!r}, topic={self.topic!r})"
