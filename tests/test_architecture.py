"""The shape of the code, held by tests (docs/architecture.md): the layers import only
downward, no module imports itself round a circle, observe/ and slo/ load without the
serving stack, and no file or folder outgrows what a reader takes in at once.

The import graph is read from the source (every `import`, at any depth, so a lazy import
inside a function counts too), not from what one run happened to load."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("observe", "slo", "serving", "alerts", "dashboards", "loadgen", "tailguard")
# Which packages each may import (besides itself): the data path's layers, bottom up.
ALLOWED = {
    "observe": set(),
    "slo": {"observe"},
    "alerts": {"observe", "slo"},
    "dashboards": {"observe", "slo", "alerts"},
    "serving": {"observe", "slo"},
    "loadgen": {"observe", "slo"},
    "tailguard": {"observe", "slo", "alerts", "dashboards", "serving", "loadgen"},
}
MAX_LINES = 300
MAX_MODULES = 15
HEAVY = ("vllm", "torch", "streamlit")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports: `from a.b import c` is a.b.c when c is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            out |= submodules
            if len(submodules) < len(node.names):  # some name is the package's own
                out.add(base)
    return {m for m in out if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(path, name, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start), on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child), on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_module_imports_itself_round_a_circle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_packages_import_only_the_layers_below_them():
    upward = sorted(f"{name} -> {target}" for name, targets in _graph().items()
                    for target in targets
                    if (top := name.split(".")[0]) != (dest := target.split(".")[0])
                    and dest not in ALLOWED[top])
    assert upward == []


def test_observe_and_slo_import_without_the_serving_stack():
    names = sorted(n for n in _modules() if n.split(".")[0] in ("observe", "slo"))
    script = (f"import sys\nfor n in {names!r}: __import__(n)\n"
              f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _product_and_bench_files() -> list[Path]:
    return sorted(p for top in (*PACKAGES, "bench", "scripts") for p in (ROOT / top).rglob("*.py"))


def test_no_file_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in _product_and_bench_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_folder_over_15_modules():
    # tests/ is a flat list of test files that pytest collects, not code a reader follows
    folders = {p.parent for p in _product_and_bench_files()}
    crowded = {str(f.relative_to(ROOT)): n for f in folders
               if (n := len(list(f.glob("*.py")))) > MAX_MODULES}
    assert crowded == {}


SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE)\b[\s\S]*\bFROM|\bFROM\s+\w+\s+WHERE\b")


@pytest.mark.parametrize("path", sorted((ROOT / "tailguard").glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_hold_no_sql(path):
    """SQL lives with the trace log or the SLO package; a command only calls it."""
    tree = ast.parse(path.read_text())
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef))
                  and (body := node.body) and isinstance(body[0], ast.Expr)}
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and id(node) not in docstrings]
    assert [s for s in strings if SQL.search(s)] == []
