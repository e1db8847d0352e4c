"""The PySpark backfill job: rebuild the worker's RocksDB stores from topic history.

Not built yet (see the open backfill work); the package exists so the import name is reserved.
"""
