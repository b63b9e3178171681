"""One set of Qwen3-Omni weights both sides of the `omni-wide` suite serve, written once under .bench/omni-wide/.

graphs/qwen3_omni.yaml's `omni-wide` preset is Qwen3-Omni-30B-A3B at its published widths with 4 of the
thinker's 48 layers and 4 of the talker's 20 (24 GiB hold no more). No checkpoint can be downloaded here, and
random weights at the published shapes stream and multiply as the real ones do, so the suite writes the
repository as the published one is laid out (Qwen/Qwen3-Omni-30B-A3B-Instruct: one directory for every
component, sharded safetensors with model.safetensors.index.json, the nested config.json, experts one tensor
per expert), at the plan's layer counts:

  .bench/omni-wide/Qwen3-Omni-30B-A3B-Instruct/   mstar-run reads it with --weights .bench/omni-wide;
                                                  transformers' from_pretrained reads the same directory

config.json comes from the compiled plan's node dims (bench.omni_hf_config), so it describes exactly the
network mstar serves (and `mstar-run check-weights` holds it to the plan). Tensors are seeded normal (std 0.02;
norm weights 1).

The tokenizer: Qwen's cannot be fetched, so tokenizer.json is a word-level one (whitespace and punctuation
split) holding the suite's prompt words, with ChatML's roles at Qwen's ids (`user` 872, `assistant` 77091,
`system` 8948: the talker finds the turns by them) and Qwen's special tokens at theirs (151643
<|endoftext|>, 151644 <|im_start|>, 151645 <|im_end|>, ...); every other id of the thinker's vocabulary is
a placeholder word, so any token the random thinker writes detokenises. tokenizer_config.json carries
ChatML's chat template. The client renders the same ids the server does (the same file, the same code).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from bench.registry import Context

REPOSITORY = "Qwen3-Omni-30B-A3B-Instruct"
SEED = 4321
SHARD_BYTES = 2 << 30
RECIPE = "2: seeded normal std 0.02, norms 1"   # a repository of another recipe is rewritten
ROLES = {"system": 8948, "user": 872, "assistant": 77091}
SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151652: "<|vision_start|>",
           151653: "<|vision_end|>", 151655: "<|image_pad|>", 151656: "<|video_pad|>", 151669: "<|audio_start|>",
           151670: "<|audio_end|>", 151671: "<tts_pad>", 151672: "<tts_text_bos>", 151673: "<tts_text_eod>",
           151675: "<|audio_pad|>"}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# transformers 5 nests the thinker's parts under `thinker.model.`; the repository keeps the names it had before
PUBLISHED_NAMES = (("thinker.model.audio_tower.", "thinker.audio_tower."), ("thinker.model.visual.", "thinker.visual."),
                   ("thinker.model.language_model.", "thinker.model."))
KINDS = {"thinker": "qwen3_moe_lm", "talker": "qwen3_omni_talker", "predictor": "qwen3_omni_code_predictor",
         "code2wav": "qwen3_omni_code2wav", "audio": "qwen3_omni_audio_encoder",
         "vision": "qwen3_omni_vision_encoder"}


@dataclass(frozen=True)
class OmniWide:
    root: Path          # --weights ROOT for mstar-run
    repo: Path          # the repository directory transformers loads


def ensure(ctx: Context, plan: Path, words: list[str]) -> OmniWide:
    """The suite's repository for `plan` (its node dims): the tensors written now if missing or of another recipe
    or config (a minute, ~11 GB on disk), the tokenizer every time (`words`: every word the suite's prompts use)."""
    root = ctx.bench_dir / "omni-wide"
    files = OmniWide(root, root / REPOSITORY)
    files.repo.mkdir(parents=True, exist_ok=True)
    config = hf_config(plan)
    write_qwen_tokenizer(files.repo, sorted(set(words)), int(config.thinker_config.text_config.vocab_size))
    wanted = {"recipe": RECIPE, "config": config.to_dict()}
    stamp = files.repo / "mstar-bench-recipe.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == json.loads(json.dumps(wanted)):
        return files
    stamp.unlink(missing_ok=True)
    config.save_pretrained(files.repo)
    _write_tensors(files.repo, config)
    stamp.write_text(json.dumps(wanted))          # last: a repository cut short is rewritten next time
    return files


def plan_dims(plan: Path) -> dict[str, dict[str, Any]]:
    """The compiled plan's dims of each Qwen3-Omni part, keyed as KINDS."""
    from mstar_compiler.plan import load_plan

    by_kind = {n.kind: dict(n.dims) for n in load_plan(plan).nodes}
    return {part: by_kind[kind] for part, kind in KINDS.items()}


def hf_config(plan: Path) -> Any:
    """transformers' config of the network `plan` serves, with sdpa attention (transformers' default on CPU)."""
    from bench.omni_hf_config import omni_config

    d = plan_dims(plan)
    return omni_config(d["thinker"], d["talker"], d["predictor"], d["code2wav"], d["audio"], d["vision"],
                       attn="sdpa")


def published_shapes(config: Any) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the published checkpoint for `config`: transformers' parameters (built on the meta
    device) under the repository's names, its stacked experts split one tensor per expert, as the repository
    stores them (the same names and shapes as tests/runtime/weights/published/'s listing, cut in depth)."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    for name, p in model.named_parameters():
        name = next((new + name[len(old):] for old, new in PUBLISHED_NAMES if name.startswith(old)), name)
        if name.endswith("experts.gate_up_proj"):
            base, (experts, fused, width) = name[: -len("gate_up_proj")], p.shape
            for e in range(experts):
                yield f"{base}{e}.gate_proj.weight", (fused // 2, width)
                yield f"{base}{e}.up_proj.weight", (fused // 2, width)
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            yield from ((f"{base}{e}.down_proj.weight", tuple(p.shape[1:])) for e in range(p.shape[0]))
        else:
            yield name, tuple(p.shape)


def _is_norm(name: str) -> bool:
    return name.endswith(".weight") and ("norm" in name.rsplit(".", 2)[-2] or name.rsplit(".", 2)[-2].startswith("ln"))


def _write_tensors(repo: Path, config: Any) -> None:
    import torch
    from safetensors.torch import save_file

    for old in repo.glob("model-*.safetensors"):
        old.unlink()
    shards: list[dict[str, torch.Tensor]] = [{}]
    index: dict[str, int] = {}
    size = 0

    def flush(last: bool) -> None:
        n = len(shards)
        save_file(shards[-1], str(repo / f"model-{n:05d}.safetensors"), metadata={"format": "pt"})
        if not last:
            shards[-1] = {}
            shards.append({})

    for i, (name, shape) in enumerate(sorted(published_shapes(config))):
        if len(shape) == 1 and _is_norm(name):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            g = torch.Generator().manual_seed(SEED * 1_000_003 + i)
            tensor = torch.randn(shape, generator=g).mul_(0.02).to(torch.bfloat16)
        if size and size + tensor.nbytes > SHARD_BYTES:
            flush(last=False)
            size = 0
        shards[-1][name] = tensor
        index[name] = len(shards)
        size += tensor.nbytes
    flush(last=True)
    total = len(shards)
    names = {}
    for n in range(1, total + 1):
        final = repo / f"model-{n:05d}-of-{total:05d}.safetensors"
        (repo / f"model-{n:05d}.safetensors").rename(final)
        names[n] = final.name
    (repo / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: names[v] for k, v in sorted(index.items())}}, indent=1))


def write_qwen_tokenizer(repo: Path, words: list[str], vocab_size: int) -> None:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    taken = {**{i: w for w, i in ROLES.items()}, **SPECIAL}
    free = (i for i in range(vocab_size) if i not in taken)
    vocab = {"[UNK]": next(free)}
    vocab.update({w: next(free) for w in words if w not in ROLES})
    vocab.update({w: i for i, w in taken.items()})                 # roles and specials at Qwen's ids
    vocab.update({f"<w{i}>": i for i in free})                        # placeholders: every id detokenises
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens([SPECIAL[i] for i in sorted(SPECIAL)])   # in the vocabulary: they keep its ids
    spec = json.loads(tok.to_str())
    if any(a["id"] != i for a, i in zip(spec["added_tokens"], sorted(SPECIAL))):
        raise AssertionError(f"the special tokens moved: {spec['added_tokens']}")
    (repo / "tokenizer.json").write_text(json.dumps(spec))
    (repo / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=1))
