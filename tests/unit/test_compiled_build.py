"""The compiled build of the per-record path (issue 37, docs/compiled.md): which module runs.

These tests need the compiled build in this checkout (``pip install -e .`` builds it; CI always
does): without it they fail, naming the missing build, rather than skip. Each runs a fresh
interpreter, since the choice is made once per process, at import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import processor
from processor import _compiled

PACKAGE = Path(processor.__file__).resolve().parent


def _setup_modules() -> list[str]:
    """``COMPILED_MODULES`` of setup.py (read, not imported: importing it runs the build)."""
    import ast

    tree = ast.parse((PACKAGE.parent / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED_MODULES":
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED_MODULES")


N = len(_setup_modules())

PROBE = """
import importlib, json, processor
from processor import _compiled
mods = sorted(_compiled._choice.modules)
for m in mods:
    importlib.import_module(m)
import sys
print(json.dumps({"info": _compiled.build_info(),
                  "files": {m: sys.modules[m].__file__ for m in mods}}))
"""


def _manifest() -> dict:
    assert _compiled.MANIFEST.exists(), (
        f"no compiled build in this checkout ({_compiled.MANIFEST} is missing): "
        f"`pip install -e .` builds it (PROCESSOR_BUILD_PURE=1 at install skips it)")
    return json.loads(_compiled.MANIFEST.read_text())


def _probe(root: Path, **env) -> dict:
    run_env = {k: v for k, v in os.environ.items() if k != _compiled.PURE_ENV}
    run_env.update(env)
    run_env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, "-c", PROBE], env=run_env, cwd=root, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_compiled_build_runs_every_module_of_its_manifest():
    modules = _manifest()["modules"]
    assert sorted(modules) == sorted(_setup_modules())
    got = _probe(PACKAGE.parent)
    assert got["info"].startswith(f"compiled ({_manifest()['compiler']}): {N} of {N} modules"), got["info"]
    not_compiled = [m for m, f in got["files"].items() if not f.endswith(".so")]
    assert not_compiled == []


def test_pure_python_forced_runs_every_py():
    _manifest()
    got = _probe(PACKAGE.parent, **{_compiled.PURE_ENV: "1"})
    assert got["info"] == f"pure Python ({_compiled.PURE_ENV}=1; a compiled build is installed)"
    assert [m for m, f in got["files"].items() if not f.endswith(".py")] == []


def test_a_module_whose_source_changed_since_the_build_runs_as_python(tmp_path):
    """An editable install never runs stale code: the edited module loads from its ``.py``,
    the others stay compiled, and the build line names the stale one."""
    _manifest()
    copy = tmp_path / "processor"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    edited = copy / "operators" / "filter.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    got = _probe(tmp_path)
    assert got["files"]["processor.operators.filter"] == str(edited)
    compiled = sorted(m for m, f in got["files"].items() if f.endswith(".so"))
    assert compiled == sorted(set(got["files"]) - {"processor.operators.filter"})
    stale = "processor.operators.filter"
    assert got["info"].endswith(f"{N - 1} of {N} modules; pure Python (stale or not built): {stale}"), \
        got["info"]


def test_a_missing_extension_runs_as_python(tmp_path):
    _manifest()
    copy = tmp_path / "processor"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    for so in (copy / "state").glob("rocksdb.*.so"):
        so.unlink()
    got = _probe(tmp_path)
    assert got["files"]["processor.state.rocksdb"] == str(copy / "state" / "rocksdb.py")
    assert f"{N - 1} of {N} modules" in got["info"], got["info"]


def test_a_module_others_cimport_edited_makes_them_run_as_python_too(tmp_path):
    """An extension built against another's declarations (a base class, a C function) cannot
    import beside that one's ``.py``: editing ``operators/base.py`` makes every module that
    cimports it, directly or not, run as Python, and only those."""
    modules = _manifest()["modules"]
    dependents = {"processor.operators.base"}
    while True:
        more = {m for m, e in modules.items() if dependents & set(e.get("cimports", ()))} - dependents
        if not more:
            break
        dependents |= more
    assert {"processor.operators.filter", "processor.operators.source", "processor.engine.task"} <= dependents
    copy = tmp_path / "processor"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.c"))
    edited = copy / "operators" / "base.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    got = _probe(tmp_path)
    as_python = sorted(m for m, f in got["files"].items() if f.endswith(".py"))
    assert as_python == sorted(dependents)
    assert f"{N - len(dependents)} of {N} modules" in got["info"], got["info"]
