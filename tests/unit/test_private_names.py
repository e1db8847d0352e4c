"""Files of ``processor/`` talk through declared interfaces (issue 49): none reads or imports a
private name (``_x``) another file defines, and the runtime's modules import each other without
a circle, even under ``TYPE_CHECKING``, but for the one pair whose docstrings say why.

What counts as a file's own: a name it defines (a function, a class, an attribute or variable it
assigns, a parameter, a ``__slots__`` entry). ``self._x`` and ``cls._x`` are always an object's
own (a subclass may use what its base class set: a protected member, as in Python at large).
A private module of the package (``processor/_compiled.py``) is a module, not a private name.

Names of other libraries are allowed only where listed here, each with why."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "processor"

# (file, base expression, private name or "*") -> why it is allowed
THIRD_PARTY = {
    ("*", "KafkaError", "*"): "confluent-kafka's names of librdkafka's local errors (documented API: "
                              "KafkaError._PARTITION_EOF, _TIMED_OUT, ...)",
    ("cli.py", "parser", "_actions"): "argparse has no public way to walk a parser's arguments",
    ("cli.py", "argparse", "*"): "argparse's action classes, to tell a flag's kind (no public names)",
    ("runtime/membership.py", "self.consumer", "_net"): "kafka-python's network client: its group "
                                                        "coordinator needs it, and only it offers it",
}


def _own_names(tree: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets):
            out.update(e.value for e in ast.walk(n.value) if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _allowed(rel: str, base: str, name: str) -> bool:
    return any(f in ("*", rel) and b == base and n in ("*", name) for f, b, n in THIRD_PARTY)


def foreign_private_names(path: Path, root: Path = ROOT) -> list[str]:
    """``line: expression`` for every private name ``path`` (a file under ``root``) uses that it
    does not define."""
    rel = str(path.relative_to(root))
    tree = ast.parse(path.read_text())
    own = _own_names(tree)
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "processor":
            for a in n.names:
                module = ROOT.parent.joinpath(*n.module.split("."), a.name)
                if _private(a.name) and not module.with_suffix(".py").exists():
                    out.append(f"{n.lineno}: from {n.module} import {a.name}")
        elif isinstance(n, ast.Attribute) and _private(n.attr):
            base = ast.unparse(n.value)
            if base in ("self", "cls") or n.attr in own or _allowed(rel, base, n.attr):
                continue
            out.append(f"{n.lineno}: {base}.{n.attr}")
    return out


def test_no_file_uses_another_files_private_names():
    found = {str(p.relative_to(ROOT)): names for p in sorted(ROOT.rglob("*.py"))
             if (names := foreign_private_names(p))}
    assert found == {}


def test_the_check_finds_a_foreign_private_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from processor.runtime.fleet import _x\n"
                     "def f(worker):\n    worker._y = 1\n    return worker._parts, worker._y, self._z\n")
    assert foreign_private_names(probe, tmp_path) == ["1: from processor.runtime.fleet import _x",
                                                      "4: worker._parts"]


RUNTIME = ROOT / "runtime"
# the one circle, and why (both docstrings say it): the task manager owns the committer, whose
# units run over its tasks and rebuild them after an aborted transaction
ALLOWED_CIRCLES = [{"commit_unit", "task_manager"}]


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    deps = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("processor.runtime."):
            deps.add(n.module.split(".")[2])
        elif isinstance(n, ast.ImportFrom) and n.module == "processor.runtime":
            deps.update(a.name for a in n.names)
    return (deps & modules) - {path.stem}


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_runtime_modules_import_without_a_circle_even_under_type_checking():
    modules = {p.stem for p in RUNTIME.glob("*.py")}
    graph = {m: _runtime_imports(RUNTIME / f"{m}.py", modules) for m in modules}
    assert import_circles(graph) == ALLOWED_CIRCLES
    silent = [m for m in sorted(set().union(*ALLOWED_CIRCLES))
              if "circle" not in (ast.get_docstring(ast.parse((RUNTIME / f"{m}.py").read_text())) or "")]
    assert silent == []


def test_the_circle_check_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
