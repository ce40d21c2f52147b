"""The package layout (DESIGN.md "Floors, bottom up"): memra's import graph has no cycle and
every floor imports only downward.

The graph is read from the source with `ast`: every `import` and `from … import` in every
module under memra/, function-local and TYPE_CHECKING ones included, relative ones resolved.
`from pkg import name` is an edge to pkg.name when that is a module, else to pkg. A package's
__init__ is not counted as imported by its submodules (Python runs it first, but it is the
package that imports its submodules, as memra/cli/__init__.py does)."""

from __future__ import annotations

import ast
from pathlib import Path

import memra

ROOT = Path(memra.__file__).resolve().parent

# the lowest floor: imports nothing from memra but each other
BASE = {"memra.errors", "memra.paths", "memra.atomic", "memra.env"}
# the tune *harness*: drives the engine and the ops, so nothing below it may import it
HARNESS = {"memra.tune.campaign", "memra.tune.measure", "memra.tune.freeze", "memra.tune.bench",
           "memra.tune.kernelcheck", "memra.tune.research", "memra.tune.board", "memra.tune.warmup",
           "memra.tune.launches"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The memra modules `name` (at `path`) imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "memra" or a.name.startswith("memra."):
                    out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not (mod == "memra" or mod.startswith("memra.")):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
    out.discard(name)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = modules(root)
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        deps = imports_of(name, path, known)
        unknown = deps - known
        assert not unknown, f"{name} imports {sorted(unknown)}, which are not modules under memra/"
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, …, a], or None (iterative DFS, deterministic)."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    for start in sorted(graph):
        if color[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        color[start] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = BLACK
                stack.pop()
                path.pop()
                continue
            if color.get(nxt, BLACK) == GREY:
                return path[path.index(nxt):] + [nxt]
            if color.get(nxt) == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    return None


def _in(mod: str, *packages: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up a floor, as 'importer -> imported (rule)'."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            rule = None
            if mod in BASE and dep not in BASE:
                rule = "errors/paths/atomic/env import only each other"
            elif _in(mod, "memra.model") and not (dep in BASE or _in(dep, "memra.model")):
                rule = "model/ imports only errors/paths/atomic/env and model/"
            elif _in(mod, "memra.text") and not (dep in BASE or _in(dep, "memra.model", "memra.text")):
                rule = "text/ imports only errors/paths/atomic/env, model/ and text/"
            elif _in(mod, "memra.cpu") and not (dep in BASE or _in(dep, "memra.model", "memra.cpu")):
                rule = "cpu/ imports only errors/paths/atomic/env, model/ and cpu/"
            elif _in(mod, "memra.gpu") and (dep in HARNESS or _in(dep, "memra.cli", "memra.session")):
                rule = "gpu/ never imports the tune harness, the CLI or generate"
            elif mod in ("memra.tune.tables", "memra.tune.receipts") and (
                    dep in HARNESS or _in(dep, "memra.gpu.engine", "memra.gpu.ops", "memra.cli", "memra.session")):
                rule = "reading a table sits below the engine"
            elif mod == "memra.tune" and dep:
                rule = "memra/tune/__init__.py imports nothing"
            elif _in(dep, "memra.cli") and not _in(mod, "memra.cli") and mod != "memra.__main__":
                rule = "only memra/__main__.py imports the CLI"
            elif dep == "memra.cli" and _in(mod, "memra.cli") and mod != "memra.cli":
                rule = "CLI submodules import memra.cli.common, never the package memra.cli"
            if rule:
                bad.append(f"{mod} -> {dep} ({rule})")
    return bad


# -- the real package ---------------------------------------------------------------------------

def test_graph_is_read():
    g = import_graph()
    # the reader sees the layout, top-level and function-local imports, and relative ones
    for m in ("memra.paths", "memra.model.gguf", "memra.text.tokenizer", "memra.cpu.reference",
              "memra.gpu.engine", "memra.gpu.runner", "memra.gpu.plan", "memra.gpu.kv", "memra.gpu.compare", "memra.gpu.q8", "memra.gpu.ops.matvec",
              "memra.tune.tables", "memra.tune.freeze", "memra.cli", "memra.cli.common", "memra.__main__"):
        assert m in g, m
    assert "memra.tune.tables" in g["memra.gpu.runner"]          # module level
    assert "memra.gpu.compile" in g["memra.gpu.cuda"]            # inside a method
    assert "memra.gpu.q8" in g["memra.gpu.ops.matvec"]
    assert {"memra.cli.run", "memra.cli.tune", "memra.cli.bench"} <= g["memra.cli"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_floors():
    bad = floor_violations(import_graph())
    assert not bad, "imports that go up a floor:\n  " + "\n  ".join(bad)


# -- the checks themselves catch what they are for ------------------------------------------------

def test_cycle_check_catches_a_cycle():
    g = {"memra.a": {"memra.b"}, "memra.b": {"memra.c"}, "memra.c": {"memra.a", "memra.d"},
         "memra.d": set()}
    assert find_cycle(g) == ["memra.a", "memra.b", "memra.c", "memra.a"]
    g["memra.c"] = {"memra.d"}
    assert find_cycle(g) is None
    assert find_cycle({"memra.x": {"memra.x"}}) == ["memra.x", "memra.x"]


def test_floor_check_catches_upward_imports():
    g = {
        "memra.errors": {"memra.paths"},                       # ok
        "memra.paths": {"memra.model.gguf"},                   # up
        "memra.model.gguf": {"memra.gpu.cuda"},                # up
        "memra.text.chat": {"memra.model.gguf"},               # ok
        "memra.cpu.reference": {"memra.text.tokenizer"},       # not allowed
        "memra.gpu.ops.norm": {"memra.tune.kernelcheck"},      # a launcher importing the harness
        "memra.gpu.engine": {"memra.tune.tables"},             # ok
        "memra.tune.tables": {"memra.gpu.engine"},             # reading a table sits below
        "memra.tune.bench": {"memra.cli.common"},              # only __main__ imports the CLI
        "memra.cli.run": {"memra.cli", "memra.cli.common"},    # back into the package
        "memra.__main__": {"memra.cli"},                       # ok
    }
    bad = floor_violations(g)
    assert [b.split(" (")[0] for b in bad] == [
        "memra.cli.run -> memra.cli",
        "memra.cpu.reference -> memra.text.tokenizer",
        "memra.gpu.ops.norm -> memra.tune.kernelcheck",
        "memra.model.gguf -> memra.gpu.cuda",
        "memra.paths -> memra.model.gguf",
        "memra.tune.bench -> memra.cli.common",
        "memra.tune.tables -> memra.gpu.engine",
    ]


def test_reader_resolves_relative_and_local_imports(tmp_path):
    pkg = tmp_path / "memra"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("from ..errors import X\n\ndef f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("import memra.sub.a\nfrom memra import errors\n")
    g = import_graph(pkg)
    assert g["memra.sub"] == {"memra.sub.a"}
    assert g["memra.sub.a"] == {"memra.errors", "memra.sub.b"}
    assert g["memra.sub.b"] == {"memra.sub.a", "memra.errors"}
    assert find_cycle(g) == ["memra.sub.a", "memra.sub.b", "memra.sub.a"]
