"""Every float tolerance in tests/ says why it is that size (issue 39).

    python tools/check_tolerances.py [PATH ...]    # default tests/; exit 1 naming file:line of each bare one

A tolerance site is
  - a closeness check (torch.testing.assert_close, torch's and numpy's allclose / isclose,
    numpy.testing.assert_allclose, math.isclose, pytest.approx) unless every tolerance it takes is given as 0 (bit
    equality); one that leaves a tolerance at the library's default is a site too, the default being a tolerance;
  - a non-zero float given to any other call as atol= / rtol= / abs= / rel= / abs_tol= / rel_tol= / tol= (or by
    position to a parameter so named of a function in the same file), and a float default of such a parameter;
  - an upper bound on a difference: `X < B` or `X <= B` (`B > X`, `B >= X`) where X takes abs(), a subtraction,
    .max() or .mean() and B holds a float, written there or through a name bound to one.

A site is reasoned when a reason comment stands on one of its statement's lines or in the comment lines just
above that statement, or when every name its tolerance uses is bound where one stands: a module constant
(`FP32_ATOL = 1e-5  # fp32 eps 1.2e-7 x ~500 sums ...`), a local, a pytest.mark.parametrize list or a for loop
(a comment on or just above the decorator / the loop's header). A helper's tolerance parameter hands the
question to its default and its callers, which are sites themselves. A reason comment names its ground (REASON:
eps, ulp, measured, exact, rounding, bits, sums, order, reassociation, accumulation, reductions): the checker
holds that a reason is there, review holds that it is right.
"""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# closeness check (the call's last name) -> its tolerance parameters as (name, position; None: keyword only)
CHECKS = {
    "assert_close": (("rtol", None), ("atol", None)),
    "allclose": (("rtol", 2), ("atol", 3)),
    "isclose": (("rtol", 2), ("atol", 3)),
    "assert_allclose": (("rtol", 2), ("atol", 3)),
    "approx": (("rel", 1), ("abs", 2)),
}
MATH_ISCLOSE = (("rel_tol", None), ("abs_tol", None))
TOLERANCE_NAMES = {"atol", "rtol", "abs", "rel", "abs_tol", "rel_tol", "tol", "tolerance"}
# the words a reason comment is recognised by: a figure's ground, not just a figure
REASON = re.compile(r"\beps\b|\bulps?\b|\bmeasured\b|\bexact|\bround|\bbits?\b|\bsum|\border\b|reassociat|accumulat|\breduc",
                    re.IGNORECASE)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class Site:
    path: Path
    line: int
    text: str           # the tolerance as written (or the check, where it leaves the defaults)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Binding:
    kind: str           # "value" (an assignment or a for loop), "parameter", "parametrize" or "opaque"
    node: ast.AST       # the statement, the function or the decorator that binds the name
    value: ast.AST | None     # what it binds (a parametrize list's values), None for a bare parameter
    module: Module | None     # where it stands (None: outside the files read)


class Module:
    """One parsed file: its tree, each node's parent, and each line's comment."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.tree = ast.parse(source, str(path))
        self.lines = source.splitlines()
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.comments = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                         if tok.type == tokenize.COMMENT}
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def segment(self, node: ast.AST) -> str:
        text = " ".join((ast.get_source_segment("\n".join(self.lines), node) or "").split())
        return text if len(text) <= 70 else text[:67] + "..."

    def reason_in(self, first: int, last: int) -> bool:
        """A reason comment on lines first..last or in the comment lines just above `first`."""
        if any(REASON.search(self.comments.get(n, "")) for n in range(first, last + 1)):
            return True
        n = first - 1
        while n >= 1 and self.lines[n - 1].lstrip().startswith("#"):
            if REASON.search(self.comments.get(n, "")):
                return True
            n -= 1
        return False

    def reasoned_at(self, node: ast.AST) -> bool:
        """A reason by the statement that holds `node` (a compound statement: its header)."""
        stmt = node
        while not isinstance(stmt, ast.stmt):
            stmt = self.parent[stmt]
        body = getattr(stmt, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body else stmt.end_lineno
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        return self.reason_in(first, last)

    def scope_of(self, node: ast.AST) -> ast.AST:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, SCOPES):
                return node
        return self.tree


class Checker:
    """Finds the tolerance sites of the files it reads and says which ones carry no reason."""

    def __init__(self) -> None:
        self.modules: dict[Path, Module | None] = {}
        self.floats: dict[int, bool] = {}           # id of a binding's value -> whether it holds a float

    def module(self, path: Path) -> Module | None:
        if path not in self.modules:
            self.modules[path] = Module(path, path.read_text()) if path.exists() else None
        return self.modules[path]

    # -- names ----------------------------------------------------------------------------------------------

    def bindings(self, mod: Module, name: str, at: ast.AST) -> list[Binding]:
        """Where `name` is bound as seen from `at`: its innermost scope that binds it, out to the module."""
        scope = mod.scope_of(at)
        while True:
            found = self._bound_in(mod, scope, name)
            if found or scope is mod.tree:
                return found or [Binding("opaque", at, None, mod)]
            scope = mod.scope_of(scope)

    def _bound_in(self, mod: Module, scope: ast.AST, name: str) -> list[Binding]:
        found = []
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            found += self._parameter(mod, scope, name)
        for node in _own_nodes(scope):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_names(t, name) for t in targets):
                    found.append(Binding("value", node, node.value, mod))
            elif isinstance(node, (ast.For, ast.comprehension)) and _names(node.target, name):
                found.append(Binding("value", node if isinstance(node, ast.For) else mod.parent[node], node.iter, mod))
            elif isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                found += self._imported(node, name)
        return found

    def _parameter(self, mod: Module, func: ast.AST, name: str) -> list[Binding]:
        args = func.args
        if not any(a.arg == name for a in args.posonlyargs + args.args + args.kwonlyargs):
            return []
        for decorator in getattr(func, "decorator_list", []):
            if _parametrizes(decorator, name):
                return [Binding("parametrize", decorator, decorator.args[1] if len(decorator.args) > 1 else None, mod)]
        default = next((d for a, d in _defaults(func) if a.arg == name), None)
        return [Binding("parameter", func, default, mod)]

    def _imported(self, node: ast.ImportFrom, name: str) -> list[Binding]:
        if not node.module or node.level or not node.module.startswith("tests"):
            return [Binding("opaque", node, None, None)]
        other = self.module(ROOT / (node.module.replace(".", "/") + ".py"))
        original = next(a.name for a in node.names if (a.asname or a.name) == name)
        return self._bound_in(other, other.tree, original) if other else []

    # -- floats and reasons ---------------------------------------------------------------------------------

    def has_float(self, mod: Module, expr: ast.AST) -> bool:
        """Whether `expr` holds a non-zero float, written in it or through the names it uses."""
        if _float_literal(expr):
            return True
        return any(self._binding_float(b) for name in _loads(expr) for b in self.bindings(mod, name.id, name))

    def _binding_float(self, b: Binding) -> bool:
        if b.value is None or b.kind == "opaque":
            return False
        if id(b.value) not in self.floats:
            self.floats[id(b.value)] = False         # while it is being found: a name bound through itself
            self.floats[id(b.value)] = self.has_float(b.module, b.value)
        return self.floats[id(b.value)]

    def reasoned(self, mod: Module, expr: ast.AST, seen: frozenset = frozenset()) -> bool:
        """No float of its own, and every name it uses bound where a reason stands."""
        if _float_literal(expr):
            return False
        return all(self._binding_reasoned(b, seen) for name in _loads(expr)
                   for b in self.bindings(mod, name.id, name))

    def _binding_reasoned(self, b: Binding, seen: frozenset) -> bool:
        if b.kind in ("opaque", "parameter") or id(b.node) in seen:
            return True          # a parameter's default and its callers are sites of their own
        if b.kind == "parametrize":
            return b.value is None or b.module.reasoned_at(b.node) or not self.has_float(b.module, b.value)
        return b.module.reasoned_at(b.node) or self.reasoned(b.module, b.value, seen | {id(b.node)})

    # -- sites ----------------------------------------------------------------------------------------------

    def bare(self, path: Path) -> tuple[int, list[Site]]:
        """(the number of tolerance sites in `path`, those without a reason)."""
        mod = self.module(path)
        count, bare = 0, []
        for node in ast.walk(mod.tree):
            for site, ok in self._sites(mod, node):
                count += 1
                if not ok:
                    bare.append(site)
        return count, sorted(bare, key=lambda s: s.line)

    def _sites(self, mod: Module, node: ast.AST) -> list[tuple[Site, bool]]:
        if isinstance(node, ast.Call):
            return self._call_sites(mod, node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return self._default_sites(mod, node)
        if isinstance(node, ast.Compare):
            return self._bound_sites(mod, node)
        return []

    def _call_sites(self, mod: Module, call: ast.Call) -> list[tuple[Site, bool]]:
        name = _call_name(call)
        params = MATH_ISCLOSE if _dotted(call.func) == "math.isclose" else CHECKS.get(name)
        if params is None:
            return self._helper_sites(mod, call)
        given = [_argument(call, p, pos) for p, pos in params]
        if all(v is not None and _is_zero(v) for v in given):
            return []            # bit equality
        if None in given:
            return [(Site(mod.path, call.lineno, f"{mod.segment(call)} (a default tolerance)"), mod.reasoned_at(call))]
        values = [v for v in given if not _is_zero(v)]
        ok = mod.reasoned_at(call) or all(self.reasoned(mod, v) for v in values)
        return [(Site(mod.path, call.lineno, ", ".join(f"{p}={mod.segment(v)}" for (p, _), v in zip(params, given)
                                                       if not _is_zero(v)) + f" in {name}"), ok)]

    def _helper_sites(self, mod: Module, call: ast.Call) -> list[tuple[Site, bool]]:
        given = [(k.arg, k.value) for k in call.keywords if k.arg in TOLERANCE_NAMES]
        helper = mod.functions.get(_call_name(call)) if isinstance(call.func, ast.Name) else None
        if helper is not None:
            names = [a.arg for a in helper.args.posonlyargs + helper.args.args]
            given += [(n, v) for n, v in zip(names, call.args) if n in TOLERANCE_NAMES]
        return [(Site(mod.path, v.lineno, f"{p}={mod.segment(v)}"), mod.reasoned_at(call) or self.reasoned(mod, v))
                for p, v in given if not _is_zero(v) and self.has_float(mod, v)]

    def _default_sites(self, mod: Module, func: ast.AST) -> list[tuple[Site, bool]]:
        return [(Site(mod.path, a.lineno, f"{a.arg}={mod.segment(d)} (default of {func.name})"),
                 mod.reason_in(a.lineno, a.end_lineno) or mod.reasoned_at(func) or self.reasoned(mod, d))
                for a, d in _defaults(func) if a.arg in TOLERANCE_NAMES and not _is_zero(d) and self.has_float(mod, d)]

    def _bound_sites(self, mod: Module, cmp: ast.Compare) -> list[tuple[Site, bool]]:
        sides = [cmp.left] + cmp.comparators
        found = []
        for left, op, right in zip(sides, cmp.ops, sides[1:]):
            if isinstance(op, (ast.Lt, ast.LtE)):
                measured, bound = left, right
            elif isinstance(op, (ast.Gt, ast.GtE)):
                measured, bound = right, left
            else:
                continue
            if _differs(measured) and self.has_float(mod, bound):
                ok = mod.reasoned_at(cmp) or self.reasoned(mod, bound)
                sign = "<=" if isinstance(op, (ast.LtE, ast.GtE)) else "<"
                found.append((Site(mod.path, cmp.lineno, f"{mod.segment(measured)} {sign} {mod.segment(bound)}"), ok))
        return found


def _defaults(func: ast.AST) -> list[tuple[ast.arg, ast.AST]]:
    """(parameter, default) for each parameter of `func` that has one."""
    args = func.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    return pairs + [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]


def _own_nodes(scope: ast.AST):
    """The nodes of `scope` outside the functions and classes nested in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _names(target: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _loads(expr: ast.AST) -> list[ast.Name]:
    """The names `expr` reads as values (not the functions it calls)."""
    called = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
    return [n for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in called]


def _float_literal(expr: ast.AST) -> bool:
    """A non-zero float written in `expr` outside the calls it makes (what a call returns is data, not a bound)."""
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Constant) and type(node.value) is float and node.value != 0:
            return True
        if not isinstance(node, ast.Call) or node is expr:
            todo.extend(ast.iter_child_nodes(node))
    return False


def _is_zero(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and type(expr.value) in (int, float) and expr.value == 0


def _dotted(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def _call_name(call: ast.Call) -> str:
    return _dotted(call.func).rpartition(".")[2]


def _argument(call: ast.Call, name: str, position: int | None) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return call.args[position] if position is not None and position < len(call.args) else None


def _parametrizes(decorator: ast.AST, name: str) -> bool:
    if not (isinstance(decorator, ast.Call) and _call_name(decorator) == "parametrize" and decorator.args):
        return False
    names = decorator.args[0]
    listed = [e.value for e in names.elts] if isinstance(names, (ast.List, ast.Tuple)) else \
        [s.strip() for s in str(getattr(names, "value", "")).split(",")]
    return name in listed


def _differs(expr: ast.AST) -> bool:
    """Whether `expr` measures a difference: abs(), a subtraction, .max() or .mean()."""
    for n in ast.walk(expr):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub):
            return True
        if isinstance(n, ast.Call) and _call_name(n) in ("abs", "max", "mean") and \
                (isinstance(n.func, ast.Attribute) or _call_name(n) == "abs"):
            return True
    return False


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [ROOT / "tests"]
    files = sorted(p for r in roots for p in ([r] if r.is_file() else r.rglob("*.py")))
    checker, total, bare = Checker(), 0, []
    for path in files:
        count, found = checker.bare(path.resolve())
        total += count
        bare += found
    for site in bare:
        print(Site(_shown(site.path), site.line, site.text))
    print(f"{len(files)} files: {total} float tolerances, {len(bare)} without a reason")
    return 1 if bare else 0


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
