"""A stream joined with a global table (Kafka Streams' ``KStreamGlobalKTableJoin``).

Invariant: each record looks up ``key_selector(key, value)`` in the global store as it is when
the record is processed (a global table is not time-synchronized: every host bootstraps it to
its topic's end before processing and keeps it current from then on); ``join`` forwards
``joiner(value, table_value)`` only when both exist, ``left_join`` for every record (with None
for a missing row or a None table key), keeping the record's key and timestamp. A key selector
or joiner that raises is a ``UserFunctionError`` under the on-error policy.
"""

from __future__ import annotations

from processor.operators.base import Processor
from processor.state import timestamped


class StreamGlobalTableJoin(Processor):
    kind = "global-join"

    def __init__(self, name, store_name, key_selector, joiner, how, table_key_serde, table_value_serde):
        super().__init__(name)
        self.store_name = store_name
        self.key_selector = key_selector
        self.joiner = joiner
        self.left = how == "left"
        self.table_key_serde = table_key_serde
        self.table_value_serde = table_value_serde
        self.unmatched = 0

    def init(self, context):
        super().init(context)
        self.store = context.get_global_store(self.store_name)

    def process(self, key, value, timestamp):
        if value is None:
            self.unmatched += 1
            return
        try:
            tk = self.key_selector(key, value)
        except Exception as exc:
            raise self.user_error(self.key_selector, exc) from exc
        row = None
        if tk is not None:
            raw = self.store.get(self.serialize(self.table_key_serde, tk, "global table key"))
            if raw is not None:
                row = self.table_value_serde.deserialize(raw[timestamped.TIMESTAMP_SIZE:])
        if row is None and not self.left:
            self.unmatched += 1
            return
        try:
            out = self.joiner(value, row)
        except Exception as exc:
            raise self.user_error(self.joiner, exc) from exc
        self.forward(key, out, timestamp)

    def metrics(self):
        return {"unmatched": self.unmatched}
