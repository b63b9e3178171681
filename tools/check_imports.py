"""The direction of the project's imports: no circles, and no layer importing one above it.

Every import statement counts (top-level, inside functions, under TYPE_CHECKING), so a circle or an upward
arrow here is one in the layering, whether or not Python trips on it.

    python tools/check_imports.py        # exit 1 on any circle or upward import, each named

LAYERS lists the layers top to bottom: a module imports its own layer and those below (docs/architecture.md
draws them). Model families are plugins beside the layers; the launchers stand outside them.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "mstar_compiler")
LAYERS = (
    ("entrypoints", ("runtime.entrypoints",)),             # mstar-run, the HTTP server, weights commands
    ("conductor", ("runtime.conductor",)),                 # requests, scheduling, KV accounting, stream ledger
    ("ranks", ("runtime.ranks",)),                         # starting, joining and watching ranks; Ray
    ("worker", ("runtime.worker",)),                       # a rank's process: its loop, node executors, loading
    ("transport", ("runtime.transport", "runtime.streams")),   # messages, sockets, keys; stream chunk policies
    ("model execution", ("runtime.model_executor", "runtime.text", "runtime.progress")),
    ("compiler", ("mstar_compiler",)),                     # the plan's types, shared by every layer
)
FAMILIES = "runtime.models"     # plugins: may import any layer, and no layer imports them (only by name)
LAUNCHERS = "runtime.launch"    # subprocess launchers for tests and tools: import the compiler only


def modules(packages: list[str]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports: `from a.b import c` names a.b.c when that is a module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {t for t in targets if t in known and t != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer(name: str) -> int | None:
    """Index in LAYERS (0 = top); None for the root package, families and launchers."""
    return next((i for i, (_, prefixes) in enumerate(LAYERS) if any(_within(name, p) for p in prefixes)), None)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import that points up a layer, into a family, or out of the launchers; and modules in no layer."""
    found = []
    for name, targets in sorted(graph.items()):
        mine = layer(name)
        if mine is None and name not in PACKAGES and not _within(name, FAMILIES) and not _within(name, LAUNCHERS):
            found.append(f"{name}: in no layer (add its package to LAYERS)")
        for target in sorted(targets):
            theirs = layer(target)
            if _within(target, FAMILIES) and not _within(name, FAMILIES):
                found.append(f"{name} -> {target}: a family is a plugin, found by name (its Family declaration)")
            elif _within(name, LAUNCHERS) and not _within(target, "mstar_compiler") and not _within(target, LAUNCHERS):
                found.append(f"{name} -> {target}: the launchers start mstar as a process, importing none of it")
            elif mine is not None and theirs is not None and theirs < mine:
                found.append(f"{name} -> {target}: {LAYERS[mine][0]} imports {LAYERS[theirs][0]}, a layer above it")
    return found


def main(argv: list[str]) -> int:
    known = modules(list(PACKAGES))
    graph = {name: imported(name, path, known) for name, path in known.items()}
    found = circles(graph)
    for component in found:
        members = set(component)
        print(f"circle of {len(component)} modules:")
        for name in component:
            print(f"  {name} -> {', '.join(sorted(graph[name] & members))}")
    wrong = upward(graph)
    for line in wrong:
        print(line)
    print(f"{len(known)} modules, {sum(map(len, graph.values()))} imports: {len(found)} circles, "
          f"{len(wrong)} imports against the layers")
    return 1 if found or wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
