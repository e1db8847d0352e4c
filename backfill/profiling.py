"""Profiling a backfill task's runs (for developers): with ``PROFILE_ENV`` set, each run is
profiled (cProfile) into a file of that directory."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("processor.backfill")

# A directory on each executor's machine: each task's run is profiled (cProfile) into
# ``run<n>-<sub>_<task>.prof`` there (for developers: ``python -m pstats`` reads them). Local
# masters inherit it from the driver's environment; on a cluster pass
# ``--conf spark.executorEnv.PROCESSOR_BACKFILL_PROFILE=DIR``.
PROFILE_ENV = "PROCESSOR_BACKFILL_PROFILE"


def profiler():
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def dump_profile(prof, name: str) -> None:
    """Write a run's profile; a directory that cannot be written costs the profile, not the run."""
    prof.disable()
    where = os.environ[PROFILE_ENV]
    try:
        os.makedirs(where, exist_ok=True)
        prof.dump_stats(os.path.join(where, name))
    except OSError as exc:
        log.warning("%s=%s: the profile %s not written: %s", PROFILE_ENV, where, name, exc)
