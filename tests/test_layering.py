"""The package's import graph against its layering, read statically from the AST (nothing of oasr_ops is imported).

Run as a script, it prints every finding for any checkout: ``python tests/test_layering.py [REPO_ROOT]``.

Checks, each listing every finding at once:
  (a) no import cycle between modules,
  (b) no import that runs up a layer (a module imports its own layer or lower ones), nor one the table forbids
      although it runs down (FORBIDDEN: the runtime never imports codegen),
  (c) no module in oasr_ops/ over MAX_LINES lines,
  (d) every module sits in a layer and every oasr_ops import names a module that exists.

What counts as an import: ``import x``, ``from x import y`` (relative or absolute, at module level or inside a
function, under ``if TYPE_CHECKING`` too: a deferred or type-only import is still a dependency, only its failure
mode differs) and ``importlib.import_module("oasr_ops....")`` / ``__import__`` with a literal name. A module that
calls ``import_module`` with a computed name (cli.py's subcommand table) has every string constant in it that names
an oasr_ops module counted as an import. ``from pkg import name`` is an import of ``pkg.name`` when that is a
module, else of ``pkg`` (its ``__init__``). The parent packages Python imports implicitly are not counted: every
module would otherwise import ``oasr_ops/__init__`` (layer 6), and a package's ``__init__`` runs its own layer.
"""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "oasr_ops"
MAX_LINES = 500

# The layer table (issue 10), bottom -> top. Data flows one way (census -> candidates -> cost model -> bench ->
# partition -> DB -> select -> op / graph pass), so imports must too: the per-call runtime read path never imports
# tune, inductor or codegen (it must not pull the offline tools or nvcc into a served process, and the DB reader's
# validators get a family's renderer through the registry instead); codegen imports nothing of ours but configs and
# paths (it is handed the config ids to compile and never reads the DB); families sit on the runtime; the offline
# tools on the families; the graph pass on the tools; the public API on everything. A key names a module or a
# package; a package's entry covers its ``__init__`` (a package ``__init__`` that re-exports its submodules is
# that layer) and every module below it. The top package's own ``__init__`` is listed alone: a new top-level
# module must be placed here explicitly rather than land on layer 6 by default.
LAYERS: dict[str, int] = {
    "oasr_ops.configs": 0,      # config ids, sentinels, the Lane dataclass
    "oasr_ops.paths": 0,        # every filesystem path, nvcc probing
    "oasr_ops._version": 0,     # __version__ (hashed by the graph pass)
    "oasr_ops.errors": 0,       # UsageError (the CLI's one error mechanism) and the input checks it shares
    "oasr_ops.env": 0,          # the OASR_* switches: accepted values, defaults, one warning for a bad value
    "oasr_ops.codegen": 1,      # emit, render, JitSpec / KernelCache / build_many
    "oasr_ops.runtime": 2,      # registry, arch, DB reader, validators, select, plans
    "oasr_ops.families": 3,     # one folder per kernel family, registered on runtime.registry
    "oasr_ops.tune": 4,         # offline tools and the locked DB writer
    "oasr_ops.inductor": 5,     # the backend and its graph passes
    "oasr_ops": 6,              # oasr_ops/__init__.py only (exact match, see layer_of)
    "oasr_ops.tuning": 6,
    "oasr_ops.quantize": 6,
    "oasr_ops.sensitivity": 6,  # per-layer quantization error and the error-budget filter (calls quantize_)
    "oasr_ops.cli": 6,
    "oasr_ops.__main__": 6,
}

# Pairs the linear order above allows but the rule forbids: codegen (L1) and the runtime (L2) are side by side
# over L0, not stacked. The runtime must load in a served process without jinja2, cutlass_library or nvcc probing,
# and it reaches a family's renderer only through its FamilySpec (the `impl` soft validator hashes that).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "oasr_ops.runtime": ("oasr_ops.codegen",),
}

# how an import made through importlib with a computed name is marked (its unresolvable candidates are skipped)
COMPUTED = "importlib, computed name"


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    path: str      # importer's file, relative to the repository root
    line: int
    how: str       # "" (module level), "in function", "type-checking", "importlib"

    def where(self) -> str:
        return f"{self.path}:{self.line}" + (f" ({self.how})" if self.how else "")


@dataclass
class Graph:
    modules: dict[str, Path]          # module name -> file
    edges: list[Edge]
    unresolved: list[str]             # "file:line: name" of oasr_ops imports naming no module


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted((root / package).rglob("*.py")) if "__pycache__" not in p.parts}


def layer_of(module: str, layers: dict[str, int], package: str = PACKAGE) -> int | None:
    """The layer of the longest key that is `module` or a package above it; the bare package key matches only
    the package's own __init__."""
    name = module
    while name:
        if name in layers and (name != package or module == package):
            return layers[name]
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_import_call(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))


def _docstring_nodes(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def bound_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level (in any branch of an ``if``/``try``/``with``/loop there, plus
    ``global`` ones); None when that cannot be known statically (``import *`` or a module ``__getattr__``)."""
    names: set[str] = set()

    def targets(t: ast.expr) -> None:
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                targets(e)
        elif isinstance(t, ast.Starred):
            targets(t.value)

    def visit(stmts: list[ast.stmt]) -> bool:
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if st.name == "__getattr__":
                    return False
                names.add(st.name)
            elif isinstance(st, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in st.names)
            elif isinstance(st, ast.ImportFrom):
                if any(a.name == "*" for a in st.names):
                    return False
                names.update(a.asname or a.name for a in st.names)
            elif isinstance(st, ast.Assign):
                for t in st.targets:
                    targets(t)
            elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
                targets(st.target)
            elif isinstance(st, (ast.For, ast.AsyncFor)):
                targets(st.target)
            elif isinstance(st, (ast.With, ast.AsyncWith)):
                for item in st.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if not visit(getattr(st, field, None) or []):
                        return False
            for handler in getattr(st, "handlers", None) or []:
                if handler.name:
                    names.add(handler.name)
                if not visit(handler.body):
                    return False
        return True

    if not visit(tree.body):
        return None
    names.update(("__file__", "__name__", "__doc__", "__path__", "__spec__", "__loader__", "__package__",
                  "__dict__", "__builtins__", "__cached__"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, ast.NamedExpr):
            targets(node.target)
    return names


def _imports(tree: ast.Module, module: str, is_pkg: bool, top: str) -> list[tuple[str, list[str], int, str]]:
    """(base, names, line, how): `base` is the absolute module named; `names` the from-imported names ([] for
    ``import x`` and importlib)."""
    found: list[tuple[str, list[str], int, str]] = []
    package = module if is_pkg else module.rpartition(".")[0]
    dynamic = False

    def visit(node: ast.AST, how: str) -> None:
        nonlocal dynamic
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            how = how or "in function"
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "type-checking")
            for child in node.orelse:
                visit(child, how)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, [], node.lineno, how))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((base, [a.name for a in node.names], node.lineno, how))
        elif isinstance(node, ast.Call) and _is_import_call(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((arg.value, [], node.lineno, "importlib"))
            else:
                dynamic = True
        for child in ast.iter_child_nodes(node):
            visit(child, how)

    visit(tree, "")
    if dynamic:  # import_module(name): every constant naming one of our modules is a candidate for `name`
        docs = _docstring_nodes(tree)
        name = re.compile(rf"^{re.escape(top)}(\.[A-Za-z_]\w*)*$")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and name.match(node.value)):
                found.append((node.value, [], node.lineno, COMPUTED))
    return found


def build_graph(root: Path, package: str = PACKAGE) -> Graph:
    modules = discover(root, package)
    edges: dict[tuple[str, str, int], Edge] = {}
    unresolved: list[str] = []
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in modules.items()}
    bound = {m: bound_names(t) for m, t in trees.items()}
    for module, path in modules.items():
        rel = path.relative_to(root).as_posix()
        tree = trees[module]
        for base, names, line, how in _imports(tree, module, path.name == "__init__.py", package):
            if base != package and not base.startswith(package + "."):
                continue  # not ours
            if base not in modules:
                if how != COMPUTED:
                        unresolved.append(f"{rel}:{line}: {base}")
                continue
            missing = [n for n in names if n != "*" and f"{base}.{n}" not in modules
                       and bound[base] is not None and n not in bound[base]]
            unresolved.extend(f"{rel}:{line}: {base} has no {n!r}" for n in missing)
            targets = [f"{base}.{n}" if f"{base}.{n}" in modules else base for n in names] or [base]
            for target in targets:
                if target != module:
                    edges.setdefault((module, target, line), Edge(module, target, rel, line, how))
    return Graph(modules, list(edges.values()), unresolved)


def find_cycles(graph: Graph) -> list[str]:
    """One line per strongly connected component of more than one module: its members and one cycle through
    them, each hop with the line that makes it."""
    adj: dict[str, dict[str, Edge]] = defaultdict(dict)
    for e in sorted(graph.edges, key=lambda e: (e.importer, e.imported, e.line)):
        adj[e.importer].setdefault(e.imported, e)

    # Tarjan's SCC, iterative (the graph is small, but recursion depth should not depend on it).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(adj[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(adj[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))

    out = []
    for comp in sorted(sccs):
        members = set(comp)
        first = comp[0]
        # BFS for the shortest way back to `first` inside the component.
        prev: dict[str, str] = {}
        frontier, seen, closing = [first], {first}, None
        while frontier and closing is None:
            nxt_frontier = []
            for u in frontier:
                for v in adj[u]:
                    if v == first:
                        closing = u
                        break
                    if v in members and v not in seen:
                        seen.add(v)
                        prev[v] = u
                        nxt_frontier.append(v)
                if closing is not None:
                    break
            frontier = nxt_frontier
        path = [closing]
        while path[-1] != first:
            path.append(prev[path[-1]])
        path.reverse()
        path.append(first)
        hops = " -> ".join(f"{a} [{adj[a][b].where()}]" for a, b in zip(path, path[1:])) + f" -> {first}"
        out.append(f"{len(comp)} modules {{{', '.join(comp)}}}: {hops}")
    return out


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def upward_imports(graph: Graph, layers: dict[str, int], package: str = PACKAGE,
                   forbidden: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """`importer -> imported (Lx -> Ly)  at file:line, ...` for each import up a layer or into a forbidden
    package (marked ``forbidden``)."""
    forbidden = FORBIDDEN if forbidden is None else forbidden
    found: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for e in graph.edges:
        li, lj = layer_of(e.importer, layers, package), layer_of(e.imported, layers, package)
        banned = any(_under(e.importer, a) and any(_under(e.imported, b) for b in bs) for a, bs in forbidden.items())
        if banned or (li is not None and lj is not None and lj > li):
            found[(e.importer, e.imported)].append(e)
    out = []
    for (a, b), es in sorted(found.items()):
        li, lj = layer_of(a, layers, package), layer_of(b, layers, package)
        tag = "" if lj is not None and li is not None and lj > li else ", forbidden"
        out.append(f"{a} -> {b} (L{li} -> L{lj}{tag})  at "
                   + ", ".join(e.where() for e in sorted(es, key=lambda e: e.line)))
    return out


def long_modules(graph: Graph, root: Path, limit: int = MAX_LINES) -> list[str]:
    out = []
    for module, path in sorted(graph.modules.items()):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root).as_posix()}: {n} lines")
    return out


def _report(title: str, items: list[str]) -> str:
    return f"{len(items)} {title}:\n  " + "\n  ".join(items)


# ---- the package ---------------------------------------------------------------------------------------------

_GRAPH = build_graph(ROOT)


def test_package_is_found():
    # Guards the other tests against passing vacuously on an empty or misplaced tree.
    assert f"{PACKAGE}.runtime.registry" in _GRAPH.modules and len(_GRAPH.edges) > 50


def test_no_import_cycles():
    cycles = find_cycles(_GRAPH)
    assert not cycles, _report("import cycle(s); each: its modules, then one cycle as importer [file:line] -> imported",
                               cycles)


def test_no_upward_imports():
    up = upward_imports(_GRAPH, LAYERS)
    assert not up, _report("import(s) against the layering (importer -> imported)", up)


def test_modules_are_small():
    long = long_modules(_GRAPH, ROOT)
    assert not long, _report(f"module(s) over {MAX_LINES} lines", long)


def test_every_module_has_a_layer_and_every_import_resolves():
    unplaced = [m for m in sorted(_GRAPH.modules) if layer_of(m, LAYERS) is None]
    problems = [f"not in the layer table (tests/test_layering.py LAYERS): {m}" for m in unplaced]
    problems += [f"names no module of the package: {u}" for u in _GRAPH.unresolved]
    assert not problems, _report("problem(s)", problems)


# ---- the checker itself, on a package of its own (so the tests above can fail) ------------------------------

def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_checker_finds_cycles_upward_imports_and_long_modules(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from . import top\n",
        "pkg/low/__init__.py": "gone = 1\n",
        "pkg/low/a.py": "from . import b\nthing = 1\n",                                 # same layer: allowed
        "pkg/low/b.py": "def f():\n    from pkg.low import a\n",             # deferred import closes a -> b -> a
        "pkg/low/c.py": "import importlib\nm = importlib.import_module('pkg.high.h')\n",  # upward, by string
        "pkg/low/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import h\n",
        "pkg/high/__init__.py": "",
        "pkg/low/e.py": "",
        "pkg/low/g.py": ("try:\n    import x as A\nexcept ImportError:\n    A = None\nif A:\n    B, (C, D) = 1, (2, 3)\n"
                         "def f():\n    global E\n    E = 1\n"),
        "pkg/mid/__init__.py": "",
        "pkg/mid/m.py": "from ..low import e\n",          # down a layer, but into a forbidden package
        "pkg/high/h.py": "from ..low.a import thing\nfrom pkg.low import e, gone\n" + "x = 1\n" * 10,
        "pkg/high/ok.py": "from ..low.g import A, B, C, D, E\n",                  # names bound in odd places
        "pkg/high/dyn.py": "import importlib\nN = ('pkg.top',)\nfor n in N:\n    importlib.import_module(n)\n",
        "pkg/top.py": "import pkg.missing\nfrom pkg.low.e import nothing\n",
    })
    layers = {"pkg.low": 0, "pkg.mid": 1, "pkg.high": 1, "pkg": 2, "pkg.top": 2}
    g = build_graph(tmp_path, "pkg")
    pairs = {(e.importer, e.imported, e.how) for e in g.edges}
    assert ("pkg.low.b", "pkg.low.a", "in function") in pairs
    assert ("pkg.high.h", "pkg.low.a", "") in pairs          # relative from-import of a name -> its module
    assert ("pkg.high.h", "pkg.low.e", "") in pairs          # from-import of a submodule
    assert ("pkg.high.h", "pkg.low", "") in pairs            # a name that is no module -> the package __init__
    assert ("pkg", "pkg.top", "") in pairs

    cycles = find_cycles(g)
    assert len(cycles) == 1 and "{pkg.low.a, pkg.low.b}" in cycles[0], cycles
    assert "pkg/low/b.py:2 (in function)" in cycles[0]

    up = upward_imports(g, layers, "pkg", forbidden={"pkg.mid": ("pkg.low.e",)})
    assert [u.split("  at ")[0] for u in up] == [
        "pkg.high.dyn -> pkg.top (L1 -> L2)",
        "pkg.low.c -> pkg.high.h (L0 -> L1)",
        "pkg.low.d -> pkg.high.h (L0 -> L1)",
        "pkg.mid.m -> pkg.low.e (L1 -> L0, forbidden)",
    ], up
    assert "importlib" in up[1] and "type-checking" in up[2]
    assert g.unresolved == ["pkg/top.py:1: pkg.missing", "pkg/top.py:2: pkg.low.e has no 'nothing'"]
    assert long_modules(g, tmp_path, limit=10) == ["pkg/high/h.py: 12 lines"]
    assert layer_of("pkg.other", layers, "pkg") is None and layer_of("pkg", layers, "pkg") == 2


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    g = build_graph(root)
    print(f"{root}: {len(g.modules)} modules, {len(g.edges)} imports")
    for title, items in (("cycle(s)", find_cycles(g)), ("import(s) against the layering", upward_imports(g, LAYERS)),
                         (f"module(s) over {MAX_LINES} lines", long_modules(g, root)),
                         ("unplaced module(s)", [m for m in sorted(g.modules) if layer_of(m, LAYERS) is None]),
                         ("unresolved import(s)", g.unresolved)):
        print(_report(title, items) if items else f"0 {title}")
