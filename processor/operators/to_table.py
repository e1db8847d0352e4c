"""``KStream.to_table()``: a stream read as a table's changelog (Kafka Streams' ``KStreamToTable``).

Invariant: the store holds, per key, the bytes of the latest value (with the timestamp of its
last real change), exactly as a table source over a topic of those records would hold them
(``apply_table_record``: the same no-op rule, KIP-557); ``Change(new, old)`` is forwarded exactly
when a key's value changes. A record without a key updates nothing and is counted
(``null_keys_skipped``), as Kafka Streams drops it; a None value deletes the key.
"""

from __future__ import annotations

from processor.operators.base import Processor
from processor.records import Change
from processor.state import timestamped
from processor.state.source_changelog import apply_table_record


class StreamToTable(Processor):
    kind = "to-table"

    def __init__(self, name, store_name, key_serde, value_serde):
        super().__init__(name)
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.store = None
        self.null_keys_skipped = 0
        self.noop_updates_skipped = 0

    def init(self, context):
        super().init(context)
        self.store = context.get_store(self.store_name)

    def process(self, key, value, timestamp):
        if key is None:
            self.null_keys_skipped += 1
            return
        kb = self.serialize(self.key_serde, key, "key")
        vb = None if value is None else self.serialize(self.value_serde, value, "value")
        old = apply_table_record(self.store, kb, vb, timestamp)
        if old is False:
            self.noop_updates_skipped += 1
            return
        old_value = None if old is None else self.value_serde.deserialize(old[timestamped.TIMESTAMP_SIZE:])
        self.forward(key, Change(value, old_value), timestamp)

    def metrics(self):
        return {"null_keys_skipped": self.null_keys_skipped, "noop_updates_skipped": self.noop_updates_skipped}
