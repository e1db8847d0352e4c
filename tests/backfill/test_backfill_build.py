"""The backfill's report names the build of the per-record path its executors ran (issue 37,
docs/compiled.md): the compiled build where their environment has it, or the pure-Python
fallback, said in the report and in a warning, never silently.

Runs on a real local Spark whose Python workers are separate processes: the fallback case sets
``PROCESSOR_PURE_PYTHON=1`` in the executors' environment only (``SparkContext.environment``,
what ``spark.executorEnv.*`` sets), so the driver stays compiled.
"""

from __future__ import annotations

import json
import logging

import backfill
from processor import StreamsBuilder
from processor._compiled import PURE_ENV, build_info, falls_back
from processor.serde import Serdes
from tests.backfill.helpers import new_topic, produce

PARTS = 2


def _app(orders: str, out: str):
    b = StreamsBuilder()
    b.table(orders, key_serde=Serdes.string(), value_serde=Serdes.json()) \
        .filter(lambda k, v: v["amount"] > 50).to_stream().to(out)
    return b.build()


def _history(bootstrap: str, unique: str) -> tuple[str, str]:
    orders = new_topic(bootstrap, f"bfb-orders-{unique}", PARTS)
    out = new_topic(bootstrap, f"bfb-out-{unique}", PARTS)
    recs = [(i % PARTS, f"o{i % 40}".encode(), json.dumps({"amount": (i * 37) % 100}).encode(),
             1_700_000_000_000 + i, None) for i in range(400)]
    produce(bootstrap, orders, recs)
    return orders, out


def test_the_report_names_the_executors_build(kafka_bootstrap, spark, tmp_path, unique, report, caplog):
    driver = build_info()
    # every module compiled and fresh (a module edited since the build runs as Python, and the
    # executors then report a fallback)
    assert driver.startswith("compiled (") and not falls_back(driver), (
        f"this checkout's build is not compiled or is stale (rebuild: pip install -e .): {driver}")
    orders, out = _history(kafka_bootstrap, unique)
    with caplog.at_level(logging.WARNING, logger="processor.backfill"):
        rep = backfill.run(_app(orders, out), bootstrap_servers=kafka_bootstrap, application_id=f"bfb-{unique}",
                           state_dir=tmp_path, spark=spark)
    assert rep.driver_build == driver
    assert rep.executor_builds == {driver: PARTS}   # one task run per partition, each compiled
    assert rep.build_line() == f"build: driver {driver}; executors {driver} (2 task runs)"
    assert f"  {rep.build_line()}" in rep.lines()
    assert not rep.executors_fall_back()
    assert [r for r in caplog.records if "pure Python" in r.getMessage()] == []
    report(rep.build_line())


def test_executors_without_the_compiled_build_fall_back_and_say_so(kafka_bootstrap, spark, tmp_path, unique,
                                                                  report, caplog):
    driver = build_info()
    assert driver.startswith("compiled ("), f"this checkout's build is not compiled: {driver}"
    orders, out = _history(kafka_bootstrap, unique)
    env = spark.sparkContext.environment
    env[PURE_ENV] = "1"
    try:
        with caplog.at_level(logging.WARNING, logger="processor.backfill"):
            rep = backfill.run(_app(orders, out), bootstrap_servers=kafka_bootstrap,
                               application_id=f"bfb-pure-{unique}", state_dir=tmp_path, spark=spark)
    finally:
        del env[PURE_ENV]
    pure = f"pure Python ({PURE_ENV}=1; a compiled build is installed)"
    assert rep.driver_build == driver and build_info() == driver   # the driver's own env untouched
    assert rep.executor_builds == {pure: PARTS}
    assert rep.build_line() == f"build: driver {driver}; executors: pure Python fallback on 2 of 2 task runs: {pure}"
    assert f"  {rep.build_line()}" in rep.lines()
    assert rep.executors_fall_back() == PARTS
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "pure Python" in
                r.getMessage()]
    assert warnings == [f"backfill: executors ran the per-record path as pure Python on 2 of 2 task run(s) "
                        f"({rep.build_line()}): the results are the same, only slower; the executors' environment "
                        f"needs this project installed with `pip install .`, which compiles it (docs/compiled.md, "
                        f"\"Spark executors\")"]
    report(rep.build_line())


def test_the_build_line_tells_a_fallback_from_another_compiled_build():
    """Without Spark: what the report makes of executor lines it cannot get from one local Spark
    (another Cython version, a stale module, a mix)."""
    driver = "compiled (cython 3.3.1): 16 of 16 modules"
    other = "compiled (cython 3.2.4): 16 of 16 modules"
    stale = "compiled (cython 3.3.1): 15 of 16 modules; pure Python (stale or not built): processor.serde"
    rep = backfill.BackfillReport("app", {}, driver_build=driver, executor_builds={other: 3})
    assert rep.build_line() == f"build: driver {driver}; executors {other} (3 task runs)"
    assert rep.executors_fall_back() == 0
    rep.executor_builds = {stale: 1, driver: 3}
    assert rep.build_line() == (f"build: driver {driver}; executors {driver} (3 task runs); "
                                f"executors: pure Python fallback on 1 of 4 task runs: {stale}")
    assert rep.executors_fall_back() == 1
    # the driver's own fallback, the executors' too: named, not warned about
    rep = backfill.BackfillReport("app", {}, driver_build=stale, executor_builds={stale: 2, driver: 1})
    assert rep.executors_fall_back() == 0
    assert rep.build_line() == (f"build: driver {stale}; executors {driver} (1 task run); "
                                f"executors: pure Python fallback on 2 of 3 task runs: {stale}")
    assert backfill.BackfillReport("app", {}, driver_build=driver).build_line() == \
        f"build: driver {driver}; executors none reported"
