"""The omni-wide suite's parts that run without its 10 GB repository: the repository's tensors against the
published listing at the cut, the tokenizer's ids, transformers' side forcing its lengths (on the tiny model),
and the rows."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import bench.omni_hf as omni_hf
from bench import omni_wide_weights as weights
from bench.registry import Context
from bench.stats import round_ratios
from bench.suite_omni_wide import SPEECH_NODES, OmniSide, _rows, prompt_text, prompt_words
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.models.qwen3_omni.serving import omni_prompt
from runtime.text.loading import load_tokenizer
from tests.runtime.models.qwen3_omni.omni_reference import hf_model, omni_config, preset, randomize
from tests.runtime.weights.published_layouts import repository

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wide_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("omni-wide") / "plan.bin"
    path.write_bytes(compile_file(str(ROOT / "graphs/qwen3_omni.yaml"), Options(preset="omni-wide")).data)
    return path


def test_the_repository_holds_the_published_tensors_of_the_cut(wide_plan: Path) -> None:
    """Every name and shape the suite writes is the published repository's, layers past the cut left out."""
    ours = dict(weights.published_shapes(weights.hf_config(wide_plan)))
    published = {name: tuple(shape) for part in repository("qwen3-omni-30b-a3b-instruct").values()
                 for name, shape in part.items()}
    cut = {"thinker": 4, "talker": 4}

    def kept(name: str) -> bool:
        layer = re.match(r"(thinker|talker)\.model\.layers\.(\d+)\.", name)
        return layer is None or int(layer.group(2)) < cut[layer.group(1)]
    assert ours == {name: shape for name, shape in published.items() if kept(name)}
    assert sum(torch.Size(s).numel() for s in ours.values()) == 5_311_194_673


def test_the_tokenizer_puts_chatml_at_qwens_ids(tmp_path: Path, wide_plan: Path) -> None:
    weights.write_qwen_tokenizer(tmp_path, prompt_words(), 152064)
    tokenizer = load_tokenizer(tmp_path)
    talker = weights.plan_dims(wide_plan)["talker"]
    ids = omni_prompt(tokenizer, talker, [{"role": "user", "content": prompt_text(1, 2)}])
    start, end = 151644, 151645        # <|im_start|>, <|im_end|>
    assert ids[:2] == [start, talker["user_token_id"]] and ids[-3:] == [end, start, talker["assistant_token_id"]]
    assert len(ids) == len(omni_prompt(tokenizer, talker, [{"role": "user", "content": prompt_text(63, 7)}]))
    assert "[UNK]" not in tokenizer.decode(ids[2:-3])            # every prompt word is in the vocabulary
    assert tokenizer.decode([151000]) == "<w151000>"              # any id the random thinker writes detokenises


@pytest.fixture(scope="module")
def tiny_omni() -> torch.nn.Module:
    torch.manual_seed(0)
    model = hf_model.Qwen3OmniMoeForConditionalGeneration(omni_config(preset("qwen3_moe_lm"))).eval()
    randomize(model, seed=11)
    model.config.talker_config.accept_hidden_layer = 1
    return model


def _prompt() -> list[int]:
    d = preset("qwen3_omni_talker")
    return [d["im_start_token_id"], d["user_token_id"], 11, 42, 43, 44, d["im_start_token_id"],
            d["assistant_token_id"], 11]


def test_transformers_side_writes_exactly_the_tokens_and_frames_asked(tiny_omni: torch.nn.Module) -> None:
    text = omni_hf.burst(tiny_omni, {"prompts": [_prompt(), _prompt()], "tokens": 5}, "ethan")
    assert text["tokens"] == [5, 5] and len(text["token_times"]) == 6 and text["samples"] == []
    assert text["token_times"] == sorted(text["token_times"]) and text["wall"] >= text["token_times"][-1]
    speech = omni_hf.burst(tiny_omni, {"prompts": [_prompt()], "tokens": 4, "frames": 9}, "ethan")
    per_frame = int(tiny_omni.code2wav.total_upsample)
    # 9 frames' samples, less the few the causal transposed convolutions trim from a decode's end (under a frame)
    assert speech["tokens"] == [4] and 8 * per_frame < speech["samples"][0] <= 9 * per_frame
    with pytest.raises(ValueError, match="one length"):
        omni_hf.burst(tiny_omni, {"prompts": [_prompt(), _prompt()[:-1]], "tokens": 2}, "ethan")


def test_rows_pair_the_sides_per_concurrency_and_add_mstars_nodes(tmp_path: Path) -> None:
    ctx = Context(rounds=2, quick=False, root=tmp_path)
    sides = {name: OmniSide(ctx, name) for name in ("mstar", "transformers")}
    for name, side in sides.items():
        side.record = {"label": name, "cache_enabled": False, "cache_source": "test"}
    keys = ["start_s", "peak_rss_gib", "cache_query_tokens", "cache_hit_tokens"]
    for n in (1, 8):
        keys += [f"text_{k}_{n}" for k in ("ttft", "tpot", "tok_s")]
        keys += [f"speech_{k}_{n}" for k in ("ttft", "ttfa", "rtf", "audio_per_s", "frames", "underrun_streams")]
        keys += [f"speech_node_s_{node}_{n}" for node in SPEECH_NODES]
    samples = {"mstar": {k: [2.0, 2.0] for k in keys}, "transformers": {k: [4.0, 4.0] for k in keys}}
    for side in samples.values():
        side["cache_query_tokens"] = side["cache_hit_tokens"] = [0, 0]
    rows = _rows(ctx, samples, sides)
    assert len(rows) == 2 + 2 * (3 + 4 + len(SPEECH_NODES))
    ttfa = next(r for r in rows if r.case == "Qwen3-Omni wide text + speech, 8 concurrent" and "audio" in r.metric
                and r.b is not None and r.metric.startswith("median time to first audio"))
    assert round_ratios(ttfa.a.samples, ttfa.b.samples, ttfa.better) == [2.0, 2.0]
    assert all(r.b is None for r in rows if "worker time per node" in r.case)
    json.dumps([r.to_dict() for r in rows])
