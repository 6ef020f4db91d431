"""The package's layering: folders are concerns, imports point one way, the engine knows no
family.

Layers, lowest first (a module imports only from its own layer or lower ones, at module
level or inside functions):

0. ``engine``, ``execution``, ``names``: cases, contracts as data, verdicts, the oracle;
   running Helion/Triton kernels on CPU; the names the command line offers (the built-in
   families as plain strings).
1. ``families``: the kernel families' contracts, layouts, judges (built on the engine).
2. ``workers``: the fork server and isolated targets.
3. ``corpus``: the file format, saving, loading, replaying and merging entries.
4. ``campaign``: plan, runner, supervised jobs, shards, calibration, minimization.
5. ``report``: progress display, summaries, the HTML report.
6. the front ends: ``cli``, ``plugin``, ``config``, ``__main__``.

The kernels under test (``kernels/``, installed as ``kda_fuzz_kernels``) are a plain
package: they import torch, triton, helion and the standard library, never kda_fuzz (the
CPU execution hooks are kda_fuzz's, installed from ``kda_fuzz.execution``).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kda_fuzz"
KERNELS = PKG.parent / "kernels"
LAYERS = {"engine": 0, "execution": 0, "_version": 0, "_kernels_path": 0, "names": 0,
          "families": 1, "workers": 2, "corpus": 3, "campaign": 4, "report": 5}
FRONT = 6
# Modules that know no kernel family: everything but the families and the CPU execution
# of Helion/Triton kernels.
NEUTRAL = ("engine", "workers", "corpus", "campaign", "report")
# Words that belong to a family (its arguments, sizes and variants), never to the engine;
# matched in code and string literals (docstrings and comments may give examples).
FAMILY_WORDS = re.compile(
    r"\b(mixed_qkv|initial_state|ssm_state_indices|A_log|dt_bias|lower_bound|"
    r"use_qk_l2norm_in_kernel|num_slots|slots?|HV|B\*HV|B·HV|packed|[Hh]elion|[Tt]riton|"
    r"gdn|GDN|KDA|kda(?![-_]fuzz)|kda_decode|gdn_decode|_execution|"
    # the packed families' sizes and the facts they add to a summary (their knobs)
    # (and a 'rows' key, rows x heads, state elements: the word rows alone is an HTML
    # table's too)
    r"(?<=')rows?(?=')|rows?\s+x\s+heads?|state\s+elements?|"
    r"max_b|max_bhv|bucket\w*|budget_bytes|tail_rows|live_rows|valid_rows|stratum_rows|"
    r"scale_largest|scale_judged|scale_sizes|judged_mode|scale_share|"
    r"scale_budget|per_row_head)\b")


def _name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in PKG.rglob("*.py")}


def _layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS.get(parts[1], FRONT) if len(parts) > 1 else FRONT


def _imports(path: Path, *, functions_only: bool = False) -> set[str]:
    """The ``kda_fuzz`` modules a file imports (all of them, or only inside functions)."""
    tree = ast.parse(path.read_text())
    mods = _modules()
    if functions_only:
        nodes = [n for f in ast.walk(tree)
                 if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                 for n in ast.walk(f)]
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import (imports are absolute here)"
            mod = node.module or ""
            if not mod.startswith("kda_fuzz"):
                continue
            for alias in node.names:
                full = f"{mod}.{alias.name}"
                found.add(full if full in mods else mod)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kda_fuzz."))
    return {f for f in found if f in mods}


def test_no_import_cycles_even_inside_functions() -> None:
    mods = _modules()
    graph = {n: {d for d in _imports(p) if d != n and not n.startswith(d + ".")}
             for n, p in mods.items()}
    # a package's __init__ imported for its own submodule is not an edge
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path, n]))
        if state.get(n) == 2:
            return
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            visit(d, [*path, n])
        state[n] = 2

    for n in sorted(graph):
        visit(n, [])


@pytest.mark.parametrize("name", sorted(_modules()))
def test_imports_point_down(name: str) -> None:
    path = _modules()[name]
    up = sorted(d for d in _imports(path) if _layer(d) > _layer(name))
    assert not up, f"{name} (layer {_layer(name)}) imports higher layers: {up}"


def _code_without_prose(path: Path) -> str:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body[0].value.value = ""  # docstrings may give examples
    return ast.unparse(tree)  # comments are gone


@pytest.mark.parametrize("name", sorted(n for n in _modules()
                                        if n.split(".")[1:2] and n.split(".")[1] in NEUTRAL))
def test_engine_names_no_family(name: str) -> None:
    hits = FAMILY_WORDS.findall(_code_without_prose(_modules()[name]))
    assert not hits, f"{name} names family specifics: {sorted(set(hits))}"


def test_every_module_has_a_layer() -> None:
    top = {p.stem for p in PKG.glob("*.py")}
    assert top <= {"__init__", "__main__", "_kernels_path", "_version", "cli", "plugin",
                   "config", "strategies", "conformance", "show", "names"}, top
    assert {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} \
        == {k for k in LAYERS if not (PKG / f"{k}.py").is_file()}


# what a module under kernels/ may import: the kernel libraries, the standard library and
# the kernels' own package
KERNEL_IMPORTS = {"torch", "triton", "helion", "kda_fuzz_kernels", "__future__",
                  *sys.stdlib_module_names}


def _imported_names(path: Path) -> set[str]:
    """Every module a file imports: import statements anywhere (functions included) and
    ``import_module("...")`` / ``__import__("...")`` calls of a literal name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import (imports are absolute here)"
            found.add(node.module or "")
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                    "import_module", "__import__") \
                and not node.args[0].value.startswith("."):
            found.add(node.args[0].value)
    return found


@pytest.mark.parametrize("path", sorted(KERNELS.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(KERNELS)))
def test_kernels_import_no_fuzzer(path: Path) -> None:
    """The kernels under test are a package a user could copy: no module under kernels/
    imports kda_fuzz (the judge imports their reference: that would be a cycle)."""
    names = _imported_names(path)
    assert not {n for n in names if n == "kda_fuzz" or n.startswith("kda_fuzz.")}, \
        f"{path.relative_to(KERNELS.parent)} imports kda_fuzz: {sorted(names)}"
    other = sorted(n for n in names if n.split(".")[0] not in KERNEL_IMPORTS)
    assert not other, f"{path.relative_to(KERNELS.parent)} imports {other}"
