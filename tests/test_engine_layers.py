"""The engine's layering: no import cycles, no family names in the core."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kda_fuzz"
# Function-level imports of sibling modules are allowed only where they keep a start-up
# cheap (the console script's --help, the pytest plugin in projects that do not opt in).
LAZY_OK = {"cli", "plugin", "__init__"}  # __init__: the public API on first use
# The core: no module of it names a family's arguments or sizes.
CORE = ("runner", "oracle", "minimize", "corpus", "isolate", "parallel", "plugin", "cli",
        "targets", "shrink", "calibrate", "channel", "findings", "interrupt")
FAMILY_NAMES = re.compile(r"\b(mixed_qkv|initial_state|ssm_state_indices|lower_bound|"
                          r"kda_decode|kda_layouts|kda_scale|_execution)\b")


def _modules() -> dict[str, Path]:
    out = {p.stem: p for p in PKG.glob("*.py")}
    out.update({f"contracts.{p.stem}": p for p in (PKG / "contracts").glob("*.py")})
    return out


def _imports(name: str, path: Path, top_level: bool) -> set[str]:
    """Sibling modules ``name`` imports (at module level, or inside functions)."""
    tree = ast.parse(path.read_text())
    pkg = name.rsplit(".", 1)[0] if "." in name else ""
    nodes = tree.body if top_level else [n for f in ast.walk(tree)
                                         if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                                         for n in ast.walk(f)]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if pkg else []
            mod = ".".join([*[b for b in base if b], *(node.module or "").split(".")]).strip(".")
            names = [mod] if node.module else [f"{mod}.{a.name}".strip(".") for a in node.names]
            found.update(n if n in _modules() else n.rsplit(".", 1)[0] for n in names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kda_fuzz."):
            found.add(node.module.removeprefix("kda_fuzz."))
    found = {"contracts.__init__" if f == "contracts" else f for f in found}
    return {f for f in found if f in _modules() and f != name}


def test_no_import_cycles() -> None:
    graph = {n: _imports(n, p, top_level=True) for n, p in _modules().items()}
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path, n]))
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in graph.get(n, ()):
            visit(d, [*path, n])
        state[n] = 2

    for n in graph:
        visit(n, [])


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n not in LAZY_OK
                                        and not n.startswith("contracts.")))
def test_no_function_level_sibling_imports(name: str) -> None:
    assert not _imports(name, _modules()[name], top_level=False), (
        f"kda_fuzz/{name}.py imports sibling modules inside functions")


@pytest.mark.parametrize("name", CORE)
def test_core_names_no_family(name: str) -> None:
    code = "\n".join(line for line in (PKG / f"{name}.py").read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    tree = ast.parse(code)
    # docstrings may give examples; the code may not use the names
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            node.value.value = ""
    hits = FAMILY_NAMES.findall(ast.unparse(tree))
    assert not hits, f"kda_fuzz/{name}.py names family specifics: {sorted(set(hits))}"
