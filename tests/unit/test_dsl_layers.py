"""The DSL modules import downward only (issue 29): each imports (at the top or inside a
function; annotations under ``TYPE_CHECKING`` aside) only DSL modules of a lower layer, so there
is no import circle; the modules of one
layer reach each other through the builder (``stream_of``/``table_of``) or by duck type
(``dsl_kind``)."""

import ast
from pathlib import Path

DSL = Path(__file__).resolve().parents[2] / "processor" / "dsl"
LAYERS = [
    {"abstract_stream", "emit", "windows", "repartition", "global_table"},
    {"joins", "stream_join", "grouped"},
    {"kstream", "ktable"},
    {"builder"},
    {"__init__"},
]


def _dsl_imports(path: Path) -> set[str]:
    """The DSL modules ``path`` imports at run time (``if TYPE_CHECKING:`` blocks aside)."""
    out = set()
    stack = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("processor.dsl."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.module == "processor.dsl":   # from processor.dsl import x
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("processor.dsl."))
        stack.extend(ast.iter_child_nodes(node))
    return out


def test_every_dsl_module_is_in_a_layer_and_imports_only_lower_layers():
    modules = {p.stem for p in DSL.glob("*.py")}
    layer_of = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    assert modules == set(layer_of), f"modules without a layer: {sorted(modules - set(layer_of))}"
    upward = [(m, dep) for m in sorted(modules) for dep in sorted(_dsl_imports(DSL / f"{m}.py"))
              if layer_of[dep] >= layer_of[m]]
    assert upward == []
