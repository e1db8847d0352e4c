"""The worker host: the poll loop, commit units, changelogs, restore and RocksDB state. It runs
``processor.engine.task.Task``, which the test driver and the backfill run too; the Kafka pieces
it shares with the backfill (client settings and factory, internal topics, partitioning,
partition ends) are in ``processor.kafka``."""
