"""Which build of the per-record path runs: the compiled extensions, or the Python sources.

Issue 37 compiles a few hot modules (``setup.py``'s ``COMPILED_MODULES``); the ``.py`` files stay the source
and the fallback. CPython's own finder prefers an extension module to a ``.py`` of the same name
in the same directory, so a compiled module built from an older source would win silently (an
editable install whose ``.py`` was edited since the build). This module puts a finder in front:

- The build (``setup.py``'s ``build_ext``) writes ``processor/_compiled.json``: per compiled
  module, the SHA-256 of the source it was built from, the compiler and its version.
- At import, for each module of that manifest, the finder hashes the ``.py`` beside it (and
  its ``.pxd``, ``source_hash``) (all of
  them together take well under a millisecond) and loads the extension only if the hash is the
  manifest's; otherwise, or with ``PROCESSOR_PURE_PYTHON=1``, or when the extension is missing,
  it loads the ``.py``. A module never compiled is none of its business.
- ``build_info()`` says what ran (``processor --version``, the demo's and the backfill's
  reports): ``compiled (cython 3.x.y): 15 of 15 modules``, or which were stale. Every line that
  names a module run from its ``.py`` says ``pure Python`` (``falls_back``: how the backfill
  tells an executor's fallback from a compiled build of another Cython version).

Installed by ``processor/__init__.py`` before it imports anything else of the package.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST = PACKAGE_DIR / "_compiled.json"
PURE_ENV = "PROCESSOR_PURE_PYTHON"

def source_path(module: str) -> Path:
    """The ``.py`` of ``module`` (a package: its ``__init__.py``), under the package directory."""
    parts = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def source_hash(path: Path) -> str:
    """The SHA-256 a build records for a module: of its ``.py`` and, where there is one, the
    ``.pxd`` beside it (its Cython declarations: editing either makes the extension stale).
    ``setup.py`` loads this file by path to compute the manifest by the same rule."""
    h = hashlib.sha256(path.read_bytes())
    pxd = path.with_suffix(".pxd")
    if pxd.exists():
        h.update(b"\0pxd\0" + pxd.read_bytes())
    return h.hexdigest()


def extension_path(module: str) -> Path | None:
    """The extension module built for ``module`` beside its source (None: none)."""
    src = source_path(module)
    stem = "__init__" if src.name == "__init__.py" else src.stem
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = src.with_name(stem + suffix)
        if p.exists():
            return p
    return None


_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport\b|cimport\s+([\w.]+))", re.MULTILINE)


def pxd_cimports(path: Path) -> list[str]:
    """The modules the ``.pxd`` beside ``path`` cimports (its extension types' bases, the C
    functions it calls): an extension built against them fails to import beside their ``.py``,
    so it is stale whenever one of them is (``_Choice.fresh``)."""
    pxd = path.with_suffix(".pxd")
    if not pxd.exists():
        return []
    return sorted({a or b for a, b in _CIMPORT.findall(pxd.read_text())} - {"cython"})


class _Choice:
    def __init__(self) -> None:
        self.pure_forced = os.environ.get(PURE_ENV, "") not in ("", "0")
        try:
            self.manifest = json.loads(MANIFEST.read_text())
        except (OSError, ValueError):
            self.manifest = {}
        self.modules: dict = self.manifest.get("modules", {})
        self.loaded: dict[str, str] = {}   # module -> "compiled" / "stale" / "missing" / "pure"
        self._fresh: dict[str, bool] = {}

    def fresh(self, module: str) -> bool:
        """Whether ``module``'s extension may run: it exists, its source hash is the manifest's,
        and so is that of every compiled module it cimports (transitively)."""
        known = self._fresh.get(module)
        if known is not None:
            return known
        self._fresh[module] = False   # (a cycle of cimports is no reason to load anything)
        entry = self.modules.get(module)
        if entry is None or extension_path(module) is None:
            return False
        try:
            ok = source_hash(source_path(module)) == entry["sha256"]
        except OSError:
            ok = False
        ok = ok and all(self.fresh(dep) for dep in entry.get("cimports", ()) if dep in self.modules)
        self._fresh[module] = ok
        return ok

    def decide(self, module: str) -> Path | None:
        """The extension to load for ``module``, or None (its ``.py``)."""
        if module not in self.modules:
            return None
        if self.pure_forced:
            self.loaded[module] = "pure"
            return None
        ext = extension_path(module)
        if ext is None:
            self.loaded[module] = "missing"
            return None
        fresh = self.fresh(module)
        self.loaded[module] = "compiled" if fresh else "stale"
        return ext if fresh else None


_choice = _Choice()


class CompiledFinder(importlib.abc.MetaPathFinder):
    """Chooses between a module's extension and its ``.py`` (see the module docstring)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _choice.modules:
            return None
        ext = _choice.decide(fullname)
        src = source_path(fullname)
        loader: importlib.abc.Loader
        if ext is not None:
            loader = importlib.machinery.ExtensionFileLoader(fullname, str(ext))
            spec = importlib.util.spec_from_file_location(fullname, str(ext), loader=loader)
        else:
            loader = importlib.machinery.SourceFileLoader(fullname, str(src))
            spec = importlib.util.spec_from_file_location(fullname, str(src), loader=loader)
        if spec is not None and src.name == "__init__.py":
            spec.submodule_search_locations = [str(src.parent)]
        return spec


def install() -> None:
    if _choice.modules and not any(isinstance(f, CompiledFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, CompiledFinder())


def build_info() -> str:
    """One line: which build of the per-record path this process runs."""
    if not _choice.modules:
        return "pure Python (not compiled: no extension was built)"
    if _choice.pure_forced:
        return f"pure Python ({PURE_ENV}=1; a compiled build is installed)"
    compiler = _choice.manifest.get("compiler", "?")
    # modules not imported yet: decided now, as the finder will
    states = {m: _choice.loaded.get(m) or ("compiled" if _choice.fresh(m) else "stale or missing")
              for m in _choice.modules}
    n = sum(1 for s in states.values() if s == "compiled")
    line = f"compiled ({compiler}): {n} of {len(states)} modules"
    off = sorted(m for m, s in states.items() if s != "compiled")
    return line + (f"; pure Python (stale or not built): {', '.join(off)}" if off else "")


def falls_back(line: str) -> bool:
    """Whether a ``build_info()`` line (of this process or another: a Spark executor's) names a
    module of the per-record path run as Python (forced, stale, or never built)."""
    return "pure Python" in line
