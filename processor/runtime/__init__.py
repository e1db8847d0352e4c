"""The worker host: all Kafka I/O (poll loop, commit units, changelogs, restore) and RocksDB
state. It runs ``processor.engine.task.Task``, which the test driver and the backfill run too."""
