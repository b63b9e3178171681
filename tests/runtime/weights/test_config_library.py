"""Config files as the library that defines their format reads them.

A repository's config.json is written by whatever release the publisher had; an older one may lack
a key a newer one writes. The seed graphs' mappings say, per checked key, what the library takes
then (`default:`, `derive:`, from `config_library:`). The oracle here is the library itself
(transformers' config classes, SNAC's constructor), never mstar's reader: for every checked key of
every seed mapping, a published config with that key removed (or null) reads the same in both.
Then `mstar-run check-weights` on published-layout repositories with such configs: it passes and
says which values came from the library; a value the library takes that disagrees still fails.
"""
from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from mstar_compiler.config_expr import MISSING, read_value
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import Plan, load_plan
from runtime.model_executor.weights import ConfigMismatch
from runtime.model_executor.weights.published import check_config
from tests.runtime.serving.conftest import REPO, compile_plan
from bench.bagel_layout import write_bagel_configs
from tests.runtime.weights.published_layouts import BAGEL_LLM, BAGEL_VIT, published_config
from tests.runtime.weights.test_check_weights import ORPHEUS_CONFIG, SNAC_24KHZ_CONFIG, write_full_root, write_orpheus_root

SEED_PRESETS = {"qwen3_omni": "qwen3-omni-30b-a3b", "orpheus": "orpheus-3b", "bagel": "bagel-7b"}
NO_VALUE = object()   # the library has no value for the key (it would fail, as mstar does)
REFUSED = object()    # the library refuses the whole config (its own validation; mstar must refuse it too)


@functools.cache
def _plan(graph: str) -> Plan:   # compiled once: collection and every test read the same plan
    return compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(preset=SEED_PRESETS[graph])).plan


def _checked_nodes() -> list[tuple[str, str]]:
    return [(graph, node.name) for graph in SEED_PRESETS for node in _plan(graph).nodes
            if node.weight_map is not None and node.weight_map.config]


def library_reader(library: str) -> Callable[[dict[str, Any], str], Any]:
    """(config, dotted key) -> the value the named library takes for the key, or NO_VALUE."""
    name, _, cls_name = library.split()
    if name == "transformers":
        import transformers
        from huggingface_hub.errors import StrictDataclassError
        cls = getattr(transformers, cls_name)

        def read_transformers(config: dict[str, Any], key: str) -> Any:
            try:
                value: Any = cls(**copy.deepcopy(config))
            except (ValueError, TypeError, StrictDataclassError):   # the class's own validation
                return REFUSED
            for part in key.split("."):
                if not hasattr(value, part):
                    return NO_VALUE
                value = getattr(value, part)
            return list(value) if isinstance(value, tuple) else value
        return read_transformers
    assert name == "snac", library
    snac_class = getattr(importlib.import_module("snac"), cls_name)

    def read_snac(config: dict[str, Any], key: str) -> Any:   # SNAC.from_config is SNAC(**config)
        bound = inspect.signature(snac_class.__init__).bind(None, **config)
        bound.apply_defaults()
        return bound.arguments.get(key, NO_VALUE)
    return read_snac


def _without(config: dict[str, Any], key: str, null: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(config)
    *parents, field = key.split(".")
    section = out
    for part in parents:
        section = section[part]
    if null:
        section[field] = None
    else:
        del section[field]
    return out


@pytest.mark.parametrize("graph,name", _checked_nodes(), ids=lambda v: v)
def test_a_key_the_file_lacks_reads_as_the_library_reads_it(graph: str, name: str) -> None:
    node = _plan(graph).node(name)
    wm = node.weight_map
    assert wm is not None and wm.config_library, f"{graph}/{name}: the mapping names no config_library"
    library = library_reader(wm.config_library)
    config = published_config(node)
    for key in wm.config:
        cases = [("absent", _without(config, key))]
        if key in wm.config_derive:
            cases.append(("null", _without(config, key, null=True)))
        for case, lacking in cases:
            theirs = library(lacking, key)
            ours = read_value(lacking, key, wm.config_defaults.get(key, MISSING), wm.config_derive.get(key))
            if theirs is NO_VALUE:
                assert ours is None, f"{key} {case}: {wm.config_library} has no value, the mapping takes {ours}"
            elif theirs is REFUSED:
                assert ours is None or ours.value != node.dims[wm.config[key]], \
                    f"{key} {case}: {wm.config_library} refuses the config, the mapping accepts {ours}"
            else:
                assert ours is not None and ours.value == theirs, \
                    f"{key} {case}: {wm.config_library} takes {theirs!r}, the mapping {ours}"


def test_a_release_era_qwen3_omni_config_passes_check_weights(tmp_path: Path) -> None:
    """transformers' older serialisation: no vision num_position_embeddings, image_size and patch_size instead."""
    plan_path = compile_plan(tmp_path, "qwen3_omni", preset="qwen3-omni-30b-a3b")
    write_full_root(tmp_path / "root", "qwen3_omni", load_plan(plan_path))
    config_file = tmp_path / "root" / "Qwen3-Omni-30B-A3B-Instruct" / "config.json"
    config = json.loads(config_file.read_text())
    vision = config["thinker_config"]["vision_config"]
    del vision["num_position_embeddings"]
    vision["image_size"] = 768
    config_file.write_text(json.dumps(config))
    reads = library_reader("transformers 5.25.0 Qwen3OmniMoeConfig")
    assert reads(config, "thinker_config.vision_config.num_position_embeddings") == 2304, "what transformers takes"

    out = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "check-weights", plan_path, "--weights",
                          str(tmp_path / "root")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all weights match" in out.stdout
    assert ("config: config.json `thinker_config.vision_config.num_position_embeddings` = 2304 (absent from "
            "config.json: the default of transformers 5.25.0 Qwen3OmniMoeConfig)") in out.stdout


def test_a_snac_config_with_only_its_non_default_arguments_passes_check_weights(tmp_path: Path) -> None:
    plan_path = compile_plan(tmp_path, "orpheus", preset="orpheus-3b")
    reads = library_reader("snac 1.2.1 SNAC")
    minimal = {k: v for k, v in SNAC_24KHZ_CONFIG.items() if reads({}, k) != v}
    assert {"codebook_size", "codebook_dim", "noise"} <= set(SNAC_24KHZ_CONFIG) - set(minimal)
    write_orpheus_root(tmp_path / "root", snac_config=minimal)
    out = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "check-weights", plan_path, "--weights",
                          str(tmp_path / "root")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all weights match" in out.stdout
    assert "config: config.json `noise` = True (absent from config.json: the default of snac 1.2.1 SNAC)" in out.stdout


def test_a_default_the_preset_disagrees_with_fails_naming_both(tmp_path: Path) -> None:
    """LlamaConfig unties the LM head when tie_word_embeddings is absent: Orpheus-3B's preset ties it."""
    node = load_plan(compile_plan(tmp_path, "orpheus", preset="orpheus-3b")).node("lm")
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in ORPHEUS_CONFIG.items()
                                                      if k != "tie_word_embeddings"}))
    with pytest.raises(ConfigMismatch) as err:
        check_config(node, tmp_path)
    assert ("config.json `tie_word_embeddings` = False (absent from config.json: the default of transformers "
            "5.25.0 LlamaConfig) but preset 'orpheus-3b' of node 'lm' has tie_word_embeddings = True") in str(err.value)


def test_a_null_key_is_derived_as_the_library_derives_it(tmp_path: Path) -> None:
    """Qwen2Config reads num_key_value_heads: null as num_attention_heads (28): BAGEL's LM has 4 KV heads."""
    node = load_plan(compile_plan(tmp_path, "bagel", preset="bagel-7b")).node("llm")
    write_bagel_configs(tmp_path, {**BAGEL_LLM, "num_key_value_heads": None}, BAGEL_VIT)
    with pytest.raises(ConfigMismatch) as err:
        check_config(node, tmp_path)
    assert ("llm_config.json `num_key_value_heads` = 28 (null or absent in llm_config.json: transformers 5.25.0 "
            "Qwen2Config derives it as num_attention_heads) but preset 'bagel-7b' of node 'llm' has "
            "num_key_value_heads = 4") in str(err.value)
