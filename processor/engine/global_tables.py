"""Global tables, the part every host shares: applying one record of a global table's topic to
its store (``StreamsBuilder.global_table``).

Invariant: a global store holds, per key, the latest value bytes of its topic with the timestamp
of the last real change, by the same rule as a table source (``apply_table_record``: no-ops
skipped, KIP-557). A record without a key, or whose bytes do not deserialize with the table's
serdes, is not applied and is counted by the host (``records_skipped``): a global table has no
task to dead-letter it for (Kafka Streams logs and skips it too by default); so is a record its
timestamp extractor fails on.
"""

from __future__ import annotations

from processor.errors import is_operational
from processor.operators.source import extract_event_time
from processor.state.source_changelog import apply_table_record


def apply_global_record(store, spec, key_bytes, value_bytes, timestamp: int) -> bool:
    """Apply one record to ``spec``'s store; False when it was skipped as poison."""
    if key_bytes is None:
        return False
    try:
        key = spec.key_serde.deserialize(key_bytes)
        value = None if value_bytes is None else spec.value_serde.deserialize(value_bytes)
        if spec.timestamp_extractor is not None:   # the row's timestamp (same rule as a source's)
            timestamp = extract_event_time(spec.timestamp_extractor, key, value, timestamp, spec.name)
    except Exception as exc:
        if is_operational(exc):   # a registry outage: the record is not skipped, the host stops
            raise
        return False
    apply_table_record(store, key_bytes, value_bytes, timestamp)
    return True
