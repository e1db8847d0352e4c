"""Build hook (issue 37, docs/compiled.md): compiles the per-record path with Cython 3.

pyproject.toml holds the project's metadata; this file only adds the extension modules, for
``pip install .`` (a wheel) and ``pip install -e .`` (built in place, beside the sources) alike.
The ``.py`` files stay the source and the fallback:

- a module that fails to compile (no C compiler, no Python headers) is left out with a warning
  and the install goes on (``optional=True``): that module runs as Python;
- ``PROCESSOR_BUILD_PURE=1`` at install time builds nothing;
- the build writes ``processor/_compiled.json`` (each module's source SHA-256 and the compiler),
  which ``processor/_compiled.py`` checks at import: a compiled module whose ``.py`` changed
  since the build is never imported, its ``.py`` is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# the per-record path (docs/compiled.md says how it was chosen)
COMPILED_MODULES = (
    "processor.engine.task",
    "processor.operators.base",
    "processor.operators.source",
    "processor.operators.filter",
    "processor.operators.sink",
    "processor.operators.aggregate",
    "processor.operators.emission",
    "processor.state.rocksdb",
    "processor.state.change_logging",
    "processor.state.source_changelog",
    "processor.state.timestamped",
    "processor.state.emitted",
    "processor.serde",
    "processor.runtime.collector",
    "processor.runtime.dispatch",
    "processor.runtime.changelog",
    "processor.runtime.changelog_reader",
    "processor.kafka.read_to_end",
    "processor.records",
    "processor.operators.foreign_key_join",
    "processor.operators.group_by",
    "processor.operators.value_getter",
    "processor.operators.table_join",
    "processor.state.memory",
    "processor.engine.record_size",
    "processor.engine.replay_filter",
    "processor.engine.routing",
    "processor.engine.fk_join_coalescing",
    "processor.serde.subscription",
    "processor.serde.change",
    "processor.provenance",
)


def _source(module: str) -> Path:
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _extensions():
    if os.environ.get("PROCESSOR_BUILD_PURE", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:   # (a build requirement: only a build without isolation can miss it)
        print("warning: Cython is not installed: the per-record path stays pure Python", file=sys.stderr)
        return []
    from setuptools import Extension
    exts = [Extension(m if not _source(m).name == "__init__.py" else m + ".__init__",
                      [str(_source(m).relative_to(ROOT))], optional=True) for m in COMPILED_MODULES]
    return cythonize(exts, language_level=3, quiet=True,
                     compiler_directives={"binding": True, "embedsignature": False,
                                          # types come from the .pxd files only: an annotation of the
                                          # .py (``x: str``) must not start rejecting a subclass
                                          "annotation_typing": False})


def _compiled_rules():
    """processor/_compiled.py, loaded by path (the package's own imports need its dependencies,
    which a build does not have): the manifest's hash is the loader's rule, one rule in one place."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_processor_compiled_rules", ROOT / "processor" / "_compiled.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildExt(build_ext):
    """build_ext + the manifest of what was built (``processor/_compiled.json``); the modules
    compile in parallel, one per core (``--parallel`` / ``-j`` overrides)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self):
        super().run()
        import Cython

        built = {}
        for ext in self.extensions:
            full = self.get_ext_fullpath(ext.name)
            if not os.path.exists(full):   # an optional extension that failed
                continue
            module = ext.name.removesuffix(".__init__")
            rules = _compiled_rules()
            built[module] = {"sha256": rules.source_hash(_source(module)),
                             "cimports": [m for m in rules.pxd_cimports(_source(module)) if m in COMPILED_MODULES]}
        target = Path(self.get_ext_fullpath("processor._manifest")).parent / "_compiled.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"compiler": f"cython {Cython.__version__}", "modules": built},
                                     indent=1, sort_keys=True) + "\n")


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
