"""The house keeps its tiers: every import points to the same or a lower tier, and no modules import
each other in a circle (docs/design.md, "Layout and layering").

Imports are read with ``ast`` from the source, including imports inside functions and under
``TYPE_CHECKING``: an import inside a function is for start-up speed, never to hide a cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "seq2seq"

#: Tier of each top-level module or package of ``seq2seq`` (docs/design.md). The package itself
#: (``seq2seq/__init__.py``, the lazy public API) and ``__main__`` sit above everything.
TIERS = {
    "errors": 0, "config": 0, "runtime": 0, "io_utils": 0, "tokenizer": 0, "metrics": 0, "toy": 0, "version": 0,
    "data": 1, "nn": 1,
    "models": 2, "checkpoint": 2, "alignment": 2,
    "decoding": 3,
    "training": 4, "attribution": 4, "serve": 4,
    "jobs": 5,
    "cli": 6,
    "": 7, "__main__": 7,
}
#: Packages of one tier that must not import each other all the same: the training loop, the
#: explanations and the server are independent of one another.
INDEPENDENT = {"training", "attribution", "serve"}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(name: str, source: str, is_package: bool, modules: set[str]) -> list[tuple[int, str]]:
    """(line, imported seq2seq module) for every import in ``source``, the module ``name``; ``from X
    import y`` counts as an import of the module ``X.y`` when there is one, else of ``X``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "seq2seq"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "seq2seq":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if sub in modules else target))
    return found


def tier_of(module: str) -> tuple[str, int]:
    top = module.split(".")[1] if "." in module else ""
    if top not in TIERS:
        raise KeyError(f"{module}: no tier; add its package to TIERS in tests/test_layers.py and docs/design.md")
    return top, TIERS[top]


def violations(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Imports that point to a higher tier or between independent packages."""
    bad = []
    for module, edges in sorted(graph.items()):
        top, tier = tier_of(module)
        for line, target in edges:
            target_top, target_tier = tier_of(target)
            if target_tier > tier:
                bad.append(f"{module} (tier {tier}) line {line} imports {target} (tier {target_tier})")
            elif top != target_top and {top, target_top} <= INDEPENDENT:
                bad.append(f"{module} line {line} imports {target}: {top}/ and {target_top}/ are independent")
    return bad


def cycles(graph: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for _, target in graph.get(node, []):
            if target == node:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph() -> dict[str, list[tuple[int, str]]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(module_name(p), p.read_text(encoding="utf-8"), p.name == "__init__.py",
                                       modules) for p in paths}


def test_every_import_points_down():
    assert violations(package_graph()) == []


def test_no_import_cycles():
    assert cycles(package_graph()) == []


def test_every_package_has_a_tier():
    for module in package_graph():
        tier_of(module)  # KeyError names a package missing from TIERS


# ----------------------------------------------------------------------------- the checker can fail


@pytest.mark.parametrize("module, source, is_package, expected", [
    ("seq2seq.models.base", "def f():\n    from ..decoding.quantize import output_rows\n", False,
     ["seq2seq.models.base (tier 2) line 2 imports seq2seq.decoding.quantize (tier 3)"]),
    ("seq2seq.runtime", "from .training.distributed import env_rank\n", False,
     ["seq2seq.runtime (tier 0) line 1 imports seq2seq.training.distributed (tier 4)"]),
    ("seq2seq.training", "from ..serve import app\n", True,
     ["seq2seq.training line 1 imports seq2seq.serve.app: training/ and serve/ are independent"]),
    ("seq2seq.decoding.search", "import seq2seq.jobs.translate\n", False,
     ["seq2seq.decoding.search (tier 3) line 1 imports seq2seq.jobs.translate (tier 5)"]),
    ("seq2seq.jobs.translate", "from ..decoding.translator import Translator\nfrom ..config import X\n", False, []),
])
def test_upward_imports_are_reported(module, source, is_package, expected):
    modules = {"seq2seq.serve.app", "seq2seq.decoding.quantize", "seq2seq.training.distributed"}
    graph = {module: imports_of(module, source, is_package, modules)}
    assert violations(graph) == expected


def test_cycles_are_reported():
    graph = {"seq2seq.a": [(1, "seq2seq.b")], "seq2seq.b": [(3, "seq2seq.c")], "seq2seq.c": [(2, "seq2seq.a")],
             "seq2seq.d": [(1, "seq2seq.a"), (2, "seq2seq.d")]}
    assert cycles(graph) == [["seq2seq.a", "seq2seq.b", "seq2seq.c"]]


def private_imports(source: str) -> list[str]:
    """Names beginning with one underscore that ``source`` imports from another module (private:
    the module that defines one is its only user; a name another module needs is made public)."""
    return [f"{node.module or '.'}.{alias.name}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module != "__future__"
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_module_imports_another_modules_private_name():
    found = {module_name(path): names for path in sorted(PACKAGE.rglob("*.py"))
             if (names := private_imports(path.read_text(encoding="utf-8")))}
    assert found == {}, f"make these public or keep them in their module: {found}"


def test_private_imports_are_reported():
    source = "from .search import Beams, _Beams\ndef f():\n    from ..config import _helper as h\n"
    assert private_imports(source) == ["search._Beams", "config._helper"]
    assert private_imports("from __future__ import annotations\nfrom .x import __version__\n") == []


#: Files allowed past ``MAX_LINES``, each with its own ceiling (issue 47 splits them: the config into
#: a package by concern, the trainer's bookkeeping into functions). The list only shrinks.
LONG_FILES = {"training/trainer.py": 470, "decoding/translator.py": 410,
              "nn/attention.py": 420}
MAX_LINES = 400


def test_no_file_grows_past_the_line_cap():
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
               for path in sorted(PACKAGE.rglob("*.py"))}
    too_long = {name: n for name, n in lengths.items() if n > LONG_FILES.get(name, MAX_LINES)}
    assert too_long == {}, f"split these by concern (limit {MAX_LINES} lines; LONG_FILES): {too_long}"
    assert all(lengths.get(name, 0) > MAX_LINES for name in LONG_FILES), "a file got short: drop it from LONG_FILES"


def public_names(source: str) -> list[str]:
    """The public names a module defines at its top level: functions, classes and assigned constants
    (``main``, a command's entry point, and names starting with ``_`` are not counted)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if not name.startswith("_") and name != "main"]


def test_no_public_name_that_nothing_uses():
    """Every public top-level name of the package is used somewhere besides its definition: in the package,
    the tests or the benchmarks (a word count over their sources; a name used only where it is defined
    counts, its module uses it). Dead code goes; a name only a module itself needs starts with ``_``."""
    import collections
    import re

    sources = [path.read_text(encoding="utf-8") for folder in (PACKAGE, PACKAGE.parent / "tests",
                                                               PACKAGE.parent / "benchmarks")
               for path in folder.rglob("*.py")]
    words = collections.Counter(word for source in sources for word in re.findall(r"[A-Za-z_]\w*", source))
    unused = sorted(f"{path.relative_to(PACKAGE)}: {name}" for path in PACKAGE.rglob("*.py")
                    for name in public_names(path.read_text(encoding="utf-8")) if words[name] <= 1)
    assert unused == [], f"nothing uses these: delete them (or start them with _ if kept on purpose): {unused}"


def test_public_names_are_read_from_the_top_level():
    source = "X = 1\n_y = 2\nZ: int = 3\ndef f():\n    inner = 4\nclass C:\n    attr = 5\ndef main(): pass\n"
    assert public_names(source) == ["X", "Z", "f", "C"]
