"""``python -m tests.backfill.cluster_job SPEC_JSON``: one ``backfill.run`` in a process of its own,
on the Spark master the spec names (a SparkContext is one per process, and the test process holds
the local one). The spec: ``factory`` ("module:function"), ``args`` (its positional arguments),
``run`` (keyword arguments of ``backfill.run``). Prints the report as one JSON line, prefixed
``REPORT ``."""

from __future__ import annotations

import importlib
import json
import sys


def main(argv: list[str]) -> int:
    import logging

    import backfill

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    spec = json.loads(argv[0])
    module, _, attr = spec["factory"].partition(":")
    topology = getattr(importlib.import_module(module), attr)(*spec.get("args", []))
    rep = backfill.run(topology, **spec["run"])
    print("REPORT " + json.dumps({"rows_read": rep.rows_read, "runs": len(rep.runs), "tasks": rep.tasks,
                                  "rows_per_store": rep.rows_per_store, "seconds": rep.seconds,
                                  "outputs_emitted": rep.outputs_emitted, "installed": rep.installed,
                                  "driver_build": rep.driver_build,
                                  "executor_builds": rep.executor_builds}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
