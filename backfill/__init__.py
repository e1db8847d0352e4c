"""The PySpark backfill job: rebuild the worker's RocksDB stores from topic history, then hand
over to the worker at the snapshot (``backfill.job``; docs/backfill.md).

``backfill.run(topology, bootstrap_servers=..., application_id=..., state_dir=None, spark=None,
emit_outputs=False, processing_guarantee="at_least_once", spark_conf=None, py_files=()) ->
BackfillReport``; the command is ``processor backfill`` or ``python -m backfill`` (the same
arguments, for ``spark-submit``). On a Spark cluster: docs/backfill.md "Backfill on a cluster".
"""

from backfill.job import BackfillReport, run

__all__ = ["BackfillReport", "run"]
