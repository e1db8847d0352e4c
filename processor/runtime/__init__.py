"""Hosts of the operator code: ``Task`` (shared by worker, driver and backfill) and the worker,
which does all Kafka I/O."""
