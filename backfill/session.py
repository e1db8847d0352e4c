"""The backfill's Spark session: its settings, its executors, and the code they need.

Invariants:

- **Settings as spark-submit gives them.** ``--conf KEY=VALUE`` (``conf``) is applied to the
  session the job creates; under spark-submit (which owns the session) a setting spark-submit
  was given wins over the job's, and so does every one of the job's own defaults.
- **Executors before work.** On a cluster master the job waits (``executor_timeout_s``) for at
  least one executor to register, and otherwise fails with one line naming the master (a
  cluster without free cores or memory), instead of waiting forever on a job nobody runs.
- **The topology's code on every executor.** Every module the pickled topology refers to by
  name that is not installed in the Python environment (the user's application module or
  package, found by unpickling the job context: exactly what an executor will import) is shipped
  with ``SparkContext.addPyFile``: a module file as it is, a package as a zip of its directory.
  Installed packages (this project included) come with the environment the executors run
  (a packed virtualenv or an image: README "Backfill on a cluster").
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
import zipfile
from pathlib import Path

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

    java = shutil.which("java") or ""
    home = os.environ.get("JAVA_HOME", "")
    key = hashlib.sha1(f"{pyspark.__version__}|{os.path.realpath(java) if java else ''}|{home}".encode()).hexdigest()[:16]
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

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    submitted = SparkConf() if under_spark_submit() else None   # spark-submit's settings
    if master or submitted is None:
        builder = builder.master(master or "local[*]")
    if submitted is None and "spark.driver.extraJavaOptions" not in (conf or {}):
        builder = builder.config("spark.driver.extraJavaOptions", driver_jvm_options())
    builder = builder.appName("processor-backfill")
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        if submitted is not None and submitted.contains(key):
            if key in (conf or {}) and submitted.get(key) != str(value):
                log.warning("--conf %s=%s: spark-submit's %s wins", key, value, submitted.get(key))
            continue
        builder = builder.config(key, str(value))
    return builder.getOrCreate()


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


# -- the code the executors need ---------------------------------------------------------------------
def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {os.path.realpath(r) for r in roots}
    return sorted(roots)


def _project_packages() -> set[str]:
    return {"processor", "backfill"}


def modules_referenced(obj) -> set[str]:
    """The modules an unpickler of ``obj`` (pickled as Spark pickles a task: cloudpickle) imports."""
    from pyspark import cloudpickle

    names: set[str] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            names.add(module)
            return super().find_class(module, name)

    Recorder(io.BytesIO(cloudpickle.dumps(obj))).load()
    return names


def modules_to_ship(obj) -> dict[str, Path]:
    """``{top-level name: path}`` of each module or package ``obj`` needs that is not installed in
    the environment (nor part of the standard library, nor this project)."""
    roots = _installed_roots()
    out: dict[str, Path] = {}
    for name in sorted(modules_referenced(obj)):
        top = name.split(".")[0]
        if top in out or top in sys.builtin_module_names or top in sys.stdlib_module_names \
                or top in _project_packages() or top == "__main__":
            continue
        mod = sys.modules.get(top)
        f = getattr(mod, "__file__", None)
        if not f:
            if mod is not None and getattr(mod, "__path__", None) is not None:
                continue   # a namespace package: its modules are found by their own names
            raise ConfigError(f"cannot ship module {top!r} to the executors: it has no file (made at run "
                              f"time?), and the topology's functions refer to it by name ({name}); define "
                              f"them in a module file, or install the module where the executors run")
        f = os.path.realpath(f)
        if not os.path.exists(f):
            raise ConfigError(f"cannot ship module {top!r} to the executors: its file {f} no longer exists")
        if any(f.startswith(r + os.sep) for r in roots):
            continue
        path = Path(f)
        out[top] = path.parent if path.name == "__init__.py" else path
    return out


def _zip_package(pkg_dir: Path, dest_dir: str) -> str:
    """A zip of a package directory (its ``.py`` files, under the package's name)."""
    target = os.path.join(dest_dir, f"{pkg_dir.name}.zip")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(pkg_dir.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            z.write(p, str(Path(pkg_dir.name) / p.relative_to(pkg_dir)))
    return target


def code_to_ship(obj, py_files=()) -> list[tuple[str, Path]]:
    """``(name, path)`` of what the executors need for ``obj`` (``modules_to_ship``) and of every
    path of ``py_files`` (``.py``, ``.zip``, ``.egg``, or a package directory); ConfigError for
    what cannot be shipped. Checked before the session starts."""
    wanted = list(modules_to_ship(obj).items())
    for f in py_files or ():
        p = Path(f)
        if not p.exists():
            raise ConfigError(f"--py-files: {f} does not exist")
        wanted.append((p.name, p))
    return wanted


def ship(spark, wanted, work_dir: str | None = None) -> list[str]:
    """``SparkContext.addPyFile`` for each of ``wanted`` (``code_to_ship``; a directory zipped
    into ``work_dir`` first). Returns the paths shipped."""
    sc = spark.sparkContext
    work_dir = work_dir or tempfile.mkdtemp(prefix="backfill-py-files-")
    os.makedirs(work_dir, exist_ok=True)
    added = []
    for name, path in wanted:
        try:
            sc.addPyFile(_zip_package(path, work_dir) if path.is_dir() else str(path))
        except Exception as exc:
            raise ConfigError(f"cannot ship {name} ({path}) to the executors: {exc}") from exc
        added.append(str(path))
    if added:
        log.info("shipped to the executors: %s", ", ".join(added))
    return added


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
