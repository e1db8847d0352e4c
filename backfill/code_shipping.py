"""Code shipping: the modules the backfill's executors need that their Python environment lacks.

Invariant: **the topology's code on every executor.** Every module the pickled topology refers to
by name that is not installed in the Python environment (the user's application module or
package, found by unpickling the job context: exactly what an executor will import) is shipped
with ``SparkContext.addPyFile``: a module file as it is, a package as a zip of its directory
whose bytes depend only on its files' names and contents (``_zip_package``). What cannot be
shipped is a ConfigError before the session starts (``code_to_ship``). Installed packages (this
project included) come with the environment the executors run (a packed virtualenv or an image:
docs/backfill.md "Backfill on a cluster").
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from processor.errors import ConfigError

log = logging.getLogger("processor.backfill")


def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {os.path.realpath(r) for r in roots}
    return sorted(roots)


def _project_packages() -> set[str]:
    return {"processor", "backfill"}


def modules_referenced(obj) -> set[str]:
    """The modules an unpickler of ``obj`` (pickled as Spark pickles a task: cloudpickle) imports:
    those of classes and functions pickled by name, and those a function pickled by value
    imports through its globals (cloudpickle's ``subimport``)."""
    from pyspark import cloudpickle

    names: set[str] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            names.add(module)
            found = super().find_class(module, name)
            if name in ("subimport", "dynamic_subimport") and module.startswith(("cloudpickle", "pyspark.cloudpickle")):
                def recorded(modname, *args):
                    names.add(modname)
                    return found(modname, *args)
                return recorded
            return found

    Recorder(io.BytesIO(cloudpickle.dumps(obj))).load()
    return names


def _imported_by(mod) -> set[str]:
    """Modules a module's globals name: the modules it imported and those of the functions and
    classes it imported from others (what its own import will need on an executor)."""
    import types

    out = set()
    for value in list(vars(mod).values()):
        if isinstance(value, types.ModuleType):
            out.add(value.__name__)
        else:
            m = getattr(value, "__module__", None)
            # (an extension's class may name a module that was never imported under that name,
            # confluent-kafka's Producer ``cimpl``: the import that brought it is what ships)
            if isinstance(m, str) and (isinstance(value, (type, types.FunctionType))) \
                    and m.split(".")[0] in sys.modules:
                out.add(m)
    return out


def _archive_of(path: str) -> str | None:
    """The zip or egg a module was imported from (``.../deps.zip/pkg/mod.py`` -> ``.../deps.zip``)."""
    p = path
    while p and p != os.path.dirname(p):
        if os.path.isfile(p) and zipfile.is_zipfile(p):
            return p
        p = os.path.dirname(p)
    return None


def modules_to_ship(obj) -> dict[str, Path]:
    """``{top-level name: path}`` of each module or package ``obj`` needs that is not installed in
    the environment (nor part of the standard library, nor this project), with what those import
    in turn: a module file, a package directory (a namespace package's too), or the zip it was
    imported from."""
    roots = _installed_roots()
    out: dict[str, Path] = {}
    seen: set[str] = set()
    work = sorted(modules_referenced(obj))
    while work:
        name = work.pop()
        if name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        if top in sys.builtin_module_names or top in sys.stdlib_module_names \
                or top in _project_packages() or top == "__main__":
            continue
        mod = sys.modules.get(top)
        f = getattr(mod, "__file__", None)
        if not f:
            locations = list(getattr(mod, "__path__", None) or [])
            if mod is None or not locations:
                raise ConfigError(f"cannot ship module {top!r} to the executors: it has no file (made at run "
                                  f"time?), and the topology's functions refer to it by name ({name}); define "
                                  f"them in a module file, or install the module where the executors run")
            f = os.path.join(os.path.realpath(locations[0]), "__init__.py")   # a namespace package
        else:
            f = os.path.realpath(f)
        if any(f.startswith(r + os.sep) for r in roots):
            continue
        if top not in out:
            archive = _archive_of(f)
            if archive is not None:
                out[top] = Path(archive)
            elif os.path.basename(f) == "__init__.py":
                out[top] = Path(os.path.dirname(f))
            elif os.path.exists(f):
                out[top] = Path(f)
            else:
                raise ConfigError(f"cannot ship module {top!r} to the executors: its file {f} no longer exists")
        sub = sys.modules.get(name)
        if sub is not None:
            work.extend(sorted(_imported_by(sub) - seen))
    return out


def _zip_package(pkg_dir: Path, dest_dir: str) -> str:
    """A zip of a package directory (its ``.py`` files, under the package's name), with an entry
    for each directory (zipimport finds a namespace package's portions by them). Its bytes
    depend only on the files' names and contents (every entry dated 1980-01-01): Spark refuses
    a second ``addPyFile`` of a name whose bytes differ, so two backfills of the same code in one
    session must ship the same zip (found when a directory entry carried the time of zipping)."""
    target = os.path.join(dest_dir, f"{pkg_dir.name}.zip")

    def entry(name: str, mode: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = mode << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        return info

    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        dirs = set()
        for p in sorted(pkg_dir.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            rel = Path(pkg_dir.name) / p.relative_to(pkg_dir)
            for parent in reversed(rel.parents[:-1]):
                if parent not in dirs:
                    dirs.add(parent)
                    z.writestr(entry(f"{parent.as_posix()}/", 0o40755), b"")
            z.writestr(entry(rel.as_posix(), 0o100644), p.read_bytes())
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
        if str(path) in added:
            continue   # (two modules of one zip)
        try:
            sc.addPyFile(_zip_package(path, work_dir) if path.is_dir() else str(path))
        except Exception as exc:
            why = str(exc)
            if "does not match contents" in why:   # (Spark keeps the first file of a name per session)
                why = ("this Spark session already has a different version of it (the code changed since "
                       "it was shipped): start a new session to ship the new code")
            raise ConfigError(f"cannot ship {name} ({path}) to the executors: {why}") from exc
        added.append(str(path))
    if added:
        log.info("shipped to the executors: %s", ", ".join(added))
    return added
