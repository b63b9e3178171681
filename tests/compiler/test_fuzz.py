"""Property: any mutation of a valid graph compiles to a plan or raises CompileError,
never another exception (and never a traceback for people)."""
from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler_helpers import REPO
from mstar_compiler.errors import CompileError
from mstar_compiler.pipeline import compile_text

SOURCES = {name: yaml.safe_load((REPO / "graphs" / f"{name}.yaml").read_text())
           for name in ("bagel", "orpheus", "qwen3_omni", "vjepa2_ac", "smollm2")}
NAMES = ["llm", "lm", "vit", "cfg", "snac", "talker", "steps", "max_tokens", "draw", "answer", "eos",
         "single", "tiny", "$steps", "$max_tokens", "$nope", "lm.token", "snac.codes", "cfg.latent", "x.y"]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=False, width=32),
                   st.sampled_from(NAMES), st.text(max_size=6))
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.sampled_from(NAMES + ["do", "repeat",
                                                                      "until", "max", "kind", "same_as",
                                                                      "parallel", "ranks", "tp"]), inner,
                                                                      max_size=3)), max_leaves=6)


def _paths(tree, prefix=()):
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _paths(value, (*prefix, i))


def _mutate(tree, path, action, value):
    tree = copy.deepcopy(tree)
    if not path:
        return value
    parent = tree
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "rename" and isinstance(parent, dict) and isinstance(value, str):
        parent[value] = parent.pop(last)
    else:
        parent[last] = value
    return tree


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_graphs_compile_or_raise_compile_error(data):
    name = data.draw(st.sampled_from(sorted(SOURCES)))
    tree = SOURCES[name]
    paths = list(_paths(tree))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "delete", "rename"]))
        tree = _mutate(tree, path, action, data.draw(VALUES))
        paths = list(_paths(tree)) or [()]
    text = yaml.safe_dump(tree, sort_keys=False)
    try:
        compiled = compile_text(text, f"{name}.yaml", verify=True)
    except CompileError as err:
        assert err.position is not None and err.position.line >= 1
        assert str(err)
    else:
        assert compiled.data[:8] == b"MSTARPLN"


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=80))
def test_arbitrary_text_raises_only_compile_error(text):
    try:
        compile_text(text, "x.yaml")
    except CompileError:
        pass
