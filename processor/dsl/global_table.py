"""``GlobalKTable``: a table every host holds whole (``StreamsBuilder.global_table``), joined by
streams through a key selector (``KStream.join(global_table, joiner, key_selector=fn)``).
"""

from __future__ import annotations


class GlobalKTable:
    """What ``StreamsBuilder.global_table`` returns: the name of its global store, its topic and
    serdes. Only a stream join reads it (Kafka Streams: a GlobalKTable has no operators).
    """

    dsl_kind = "global-table"

    def __init__(self, store_name: str, topic: str, key_serde, value_serde):
        self.store_name = store_name
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde

    def __repr__(self):
        return f"GlobalKTable({self.store_name!r}, topic={self.topic!r})"
