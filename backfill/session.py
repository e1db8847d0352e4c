"""The backfill's Spark session: its settings, its executors, and warming them up (the code they
need is shipped by ``backfill.code_shipping``).

Invariants:

- **Settings as spark-submit gives them.** ``--conf KEY=VALUE`` (``conf``) is applied to the
  session the job creates; under spark-submit (which owns the session) a setting spark-submit
  was given wins over the job's, and so does every one of the job's own defaults.
- **Executors before work.** On a cluster master the job waits (``executor_timeout_s``) for at
  least one executor to register, and otherwise fails with one line naming the master (a
  cluster without free cores or memory), instead of waiting forever on a job nobody runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time

from processor.errors import ConfigError

log = logging.getLogger("processor.backfill")

# the job's own defaults; a --conf of the same key, or spark-submit's, wins
DEFAULT_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8",
                "spark.sql.session.timeZone": "UTC"}


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


CDS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "processor", "spark-cds")
CDS_SETTLE_S = 60.0   # a recorded archive unchanged this long is complete


def driver_jvm_options(cache_dir: str = CDS_DIR) -> str:
    """Options for the driver JVM the job starts itself, for a shorter start (measured here: the
    session in ~2.6 s instead of ~5 s): C1 only (``-XX:TieredStopAtLevel=1``: the driver's JVM
    schedules, the Python workers compute) and a class-data-sharing archive of the classes Spark
    loads, kept under ``~/.cache/processor/spark-cds`` (~110 MB) per pyspark version and ``java``.
    A run without an archive records one at the JVM's exit (its start takes ~3 s more, once)
    under a name of its own, which a later run adopts once it has not changed for
    ``CDS_SETTLE_S`` (the JVM may still be writing it after the Python process ended); while a
    recording is that recent, no other run records one. An archive the JVM cannot use (another
    Java build, another class path) is ignored by the JVM."""
    import hashlib

    import pyspark

    java = os.path.realpath(shutil.which("java") or "")
    home = os.environ.get("JAVA_HOME", "")
    try:   # the binary's identity: an upgrade in place makes a new key (the JVM rejects an old archive)
        st = os.stat(os.path.join(home, "bin", "java") if home else java)
        ident = f"{st.st_size}-{int(st.st_mtime)}"
    except OSError:
        ident = ""
    key = hashlib.sha1(f"{pyspark.__version__}|{java}|{home}|{ident}".encode()).hexdigest()[:16]
    archive = os.path.join(cache_dir, f"spark-{pyspark.__version__}-{key}.jsa")
    base = "-XX:TieredStopAtLevel=1 -Xlog:cds=off -Xlog:cds+dynamic=off"
    try:
        os.makedirs(cache_dir, exist_ok=True)
        if not os.path.exists(archive):
            now = time.time()
            recorded = [os.path.join(cache_dir, n) for n in os.listdir(cache_dir)
                        if n.rpartition(".")[0] == os.path.basename(archive)]
            settled = sorted((f for f in recorded if now - os.path.getmtime(f) > CDS_SETTLE_S), key=os.path.getmtime)
            if settled:
                os.replace(settled[-1], archive)
                for f in settled[:-1]:
                    os.unlink(f)
                for name in os.listdir(cache_dir):   # archives of other pyspark or Java builds
                    if name.endswith(".jsa") and name != os.path.basename(archive):
                        os.unlink(os.path.join(cache_dir, name))
            elif recorded:   # one being recorded, or just written: this run goes without
                return base
        if os.path.exists(archive):
            return f"{base} -XX:SharedArchiveFile={archive}"
        return f"{base} -XX:ArchiveClassesAtExit={archive}.{os.getpid()}"
    except OSError as exc:   # no cache directory: C1 alone
        log.info("no class-data-sharing archive for Spark's JVM (%s)", exc)
        return base


def spark_session(master: str | None, conf: dict | None = None):
    """The job's session: ``master`` (default ``local[*]``; spark-submit's under spark-submit),
    the job's defaults, then ``conf`` over them; under spark-submit its own settings win. A JVM
    the job starts itself gets ``driver_jvm_options`` unless ``conf`` names
    ``spark.driver.extraJavaOptions``."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    submitted = None
    if under_spark_submit():   # spark-submit's settings: its JVM's, once the gateway is joined
        from pyspark import SparkContext

        SparkContext._ensure_initialized()
        submitted = SparkConf()
    python = (conf or {}).get("spark.pyspark.python")
    if submitted is None and python:
        # (pyspark takes the executors' Python from this variable; spark-submit sets it from the setting)
        os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master or submitted is None:
        builder = builder.master(master or "local[*]")
    if submitted is None and "spark.driver.extraJavaOptions" not in (conf or {}) \
            and not _in_spark_defaults("spark.driver.extraJavaOptions"):
        builder = builder.config("spark.driver.extraJavaOptions", driver_jvm_options())
    builder = builder.appName("processor-backfill")
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        if submitted is not None and submitted.contains(key):
            if key in (conf or {}) and submitted.get(key) != str(value):
                log.warning("--conf %s=%s: spark-submit's %s wins", key, value, submitted.get(key))
            continue
        builder = builder.config(key, str(value))
    return builder.getOrCreate()


def _in_spark_defaults(key: str) -> bool:
    """Whether the ``spark-defaults.conf`` spark-submit will read sets ``key`` (then the job's own
    value would replace it)."""
    dirs = [os.environ.get("SPARK_CONF_DIR")]
    if os.environ.get("SPARK_HOME"):
        dirs.append(os.path.join(os.environ["SPARK_HOME"], "conf"))
    else:
        import pyspark

        dirs.append(os.path.join(os.path.dirname(pyspark.__file__), "conf"))
    for d in filter(None, dirs):
        try:
            with open(os.path.join(d, "spark-defaults.conf")) as f:
                if any(line.split() and line.split()[0] == key for line in f):
                    return True
        except OSError:
            continue
    return False


def is_local(spark) -> bool:
    return spark.sparkContext.master.startswith("local")


def wait_for_executors(spark, timeout_s: float) -> int:
    """On a cluster master: the number of executors registered, waiting up to ``timeout_s`` for
    the first (ConfigError when none comes). On a local master: 0 at once."""
    if is_local(spark):
        return 0
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout_s
    while True:
        n = sc._jsc.sc().getExecutorMemoryStatus().size() - 1   # (the driver's block manager too)
        if n > 0:
            return n
        if time.monotonic() > deadline:
            raise ConfigError(f"Spark master {sc.master} gave the backfill no executor within {timeout_s:.0f} s "
                              f"(no worker with free cores and memory for spark.executor.cores="
                              f"{sc.getConf().get('spark.executor.cores', '(all)')}, spark.executor.memory="
                              f"{sc.getConf().get('spark.executor.memory', '1g')}?)")
        time.sleep(0.2)


# -- warming up -----------------------------------------------------------------------------------------
# (Arrow, for archives and outputs only, is imported where those are)
WARM_UP_MODULES = ["backfill.range_reader", "backfill.task_run", "processor.engine.task", "processor.state.memory",
                   "confluent_kafka"] + [f"processor.operators.{m}" for m in (
                       "source", "sink", "filter", "map_values", "aggregate", "group_by", "table_join",
                       "stream_join", "foreign_key_join")]


def _warm_up_worker(_):
    """In an executor: import what the tasks run (a reused Python worker keeps it)."""
    import importlib

    for name in WARM_UP_MODULES:
        importlib.import_module(name)
    return os.getpid()


class WarmUp:
    """A Spark job, in a thread, with one task per core that imports the engine in the
    executors' Python workers (Spark reuses them), so that the first run does not pay for their
    start; it overlaps the snapshot, which waits on the broker. A failure is only logged: the
    runs that follow meet it again and report it."""

    def __init__(self, spark):
        self.error = None
        n = max(1, spark.sparkContext.defaultParallelism)

        def job():
            try:
                spark.sparkContext.parallelize(range(n), n).map(_warm_up_worker).collect()
            except Exception as exc:   # noqa: BLE001 (reported by the runs)
                self.error = exc

        self._thread = threading.Thread(target=job, name="backfill-warm-up", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            log.warning("backfill: warming up the executors failed: %s", str(self.error).splitlines()[0])
            self.error = None
