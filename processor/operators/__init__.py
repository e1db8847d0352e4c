"""Pure operator logic. No Kafka or RocksDB imports here: operators see the KeyValueStore
protocol, ``Change`` values and a ``ProcessorContext``; the worker, the test driver and the
backfill host the very same classes."""
