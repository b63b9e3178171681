"""A decoder's whole layer stack as one call into the CPU kernels (runtime/model_executor/kernels/cpu_stack.cpp).

`DecoderLM._forward_fused` calls the fused CPU kernels layer by layer from Python: per layer
four GEMMs, RoPE with the KV write, attention, two residual adds with their norms and SiLU·up,
plus the module calls, views and allocations between them: at small batches that Python is a
large share of a decode step (docs/benchmark-log.md). `LayerStack` hands the layers' packed
weights and the batch's attention rows to one C++ function that makes the same kernel calls, with
the same arguments in the same order, so its output is bit-equal to the per-layer path's
(tests/runtime/models/decoder_lm/test_cpu_stack.py).

It takes the layers the per-layer path would run on those kernels, nothing else: no tensor
parallelism, no sparse MoE or replaced MLP, no q/k norms, no bias on the row-parallel
projections (the per-layer path adds it after the GEMM, in the activations' dtype), the `cpu`
attention backend with heads its kernels take, every linear on its panel-packed weight (bf16 on AMX
machines packs for oneDNN: `MSTAR_CPU_LINEAR=mstar` for the stack there), and one norm epsilon. Any other
model or batch runs the per-layer path, as before. `DecoderLM.cpu_stack = False` switches it
off for a model (tools/profile_decode.py does, to time the kernels one by one). The C++ side keeps
its activations (those of the largest batch so far: ~30 MB for 1,024 fp32 rows of SmolLM2) from
call to call, where the per-layer path hands them back to torch's allocator.
"""
from __future__ import annotations

from typing import Any

import torch

from runtime.model_executor.attention.cpu_backend import CpuAttention
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers.attention import DecoderAttention
from runtime.model_executor.layers.mlp import GatedMLP

# one row of the layer table per layer (cpu_stack.cpp's Field, in this order); 0 stands for no bias
LAYER_FIELDS = ("qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up", "gate_up_bias", "down", "down_bias",
                "next_norm", "k_cache", "v_cache")
_K_CACHE = LAYER_FIELDS.index("k_cache")


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


class LayerStack:
    """The layer table of one model (weights fixed at load; the KV caches filled in per forward)."""

    def __init__(self, lm: Any) -> None:
        layers, config = lm.model.layers, lm.config
        self.lm = lm
        self.num_layers = len(layers)
        self.first_norm = layers[0].input_layernorm.weight
        self.eps = float(layers[0].input_layernorm.eps)
        attn = layers[0].self_attn
        self.hq, self.hkv, self.d = attn.num_q_heads, attn.num_kv_heads, attn.head_dim
        self.scale = float(attn.scale)
        self.inter = config.intermediate_size
        self.hidden = config.hidden_size
        self.table = torch.zeros((self.num_layers, len(LAYER_FIELDS)), dtype=torch.int64)
        self._cache_of: Any = None       # the PagedKVCache whose addresses the table holds
        self._mods = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                      layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        self._filled: tuple | None = None      # what the weight columns were filled for (_fill's key)
        self._cannot: set[tuple] = set()       # such keys whose linears are not all panel-packed in the dtype
        self._keep: Any = None

    @staticmethod
    def for_model(lm: Any) -> "LayerStack | None":
        """A stack for `lm`, or None where the per-layer path must run (module doc)."""
        config, layers = lm.config, lm.model.layers
        if lm.tp.size != 1 or any(config.sparse_layers) or config.qk_norm or not len(layers):
            return None
        eps = {float(lm.model.norm.eps)}
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            if (type(attn) is not DecoderAttention or type(mlp) is not GatedMLP
                    or attn.o_proj.bias is not None or mlp.down_proj.bias is not None
                    or not cpu_kernels.heads_fit(attn.head_dim) or not cpu_kernels.prefill_heads_fit(attn.head_dim)):
                return None
            eps |= {float(layer.input_layernorm.eps), float(layer.post_attention_layernorm.eps)}
        if len(eps) != 1:
            return None
        return LayerStack(lm)

    def _linears(self, dtype: torch.dtype) -> list[list[torch.Tensor]] | None:
        """Per layer the panel-packed qkv, o, gate_up and down weights, or None."""
        packed = []
        for mod in self._mods:
            p = mod.packed
            if not isinstance(p, torch.Tensor) or p.dim() != 3 or p.dtype != dtype or mod.weight.dtype != dtype:
                return None
            packed.append(p)
        return [packed[i:i + 4] for i in range(0, len(packed), 4)]

    def _fill(self, dtype: torch.dtype, kv_cache: Any) -> bool:
        """The table's weight columns (once per dtype and packed copies) and the cache's addresses (once per
        cache)."""
        key = (dtype, tuple(id(m.packed) for m in self._mods))    # packed again: other addresses
        if key in self._cannot:
            return False
        if self._filled != key:
            linears = self._linears(dtype)
            if linears is None:
                self._cannot.add(key)
                return False
            layers = self.lm.model.layers
            for i, (layer, (qkv, o, gate_up, down)) in enumerate(zip(layers, linears)):
                nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else self.lm.model.norm.weight
                row = (qkv, layer.self_attn.qkv_proj.bias, o, None, layer.post_attention_layernorm.weight, gate_up,
                       layer.mlp.gate_up_proj.bias, down, None, nxt)
                if any(t is not None and t.dtype != dtype for t in row):
                    self._cannot.add(key)
                    return False
                self.table[i, :_K_CACHE] = torch.tensor([_address(t) for t in row], dtype=torch.int64)
            self._filled = key
            self._keep = linears           # the addresses stay valid while these live
        if self._cache_of is not kv_cache:
            for i in range(self.num_layers):
                self.table[i, _K_CACHE] = kv_cache.k[i].data_ptr()
                self.table[i, _K_CACHE + 1] = kv_cache.v[i].data_ptr()
            self._cache_of = kv_cache
        return True

    def run(self, residual: torch.Tensor, ctx: Any) -> torch.Tensor | None:
        """The final-normed hidden states of the batch (residual updated in place, as the per-layer path
        does), or None where this batch must take the per-layer path."""
        backend, kv = ctx.backend, ctx.kv_cache
        n, dtype = residual.shape[0], residual.dtype
        if (type(backend) is not CpuAttention or ctx.rope is None or kv.dtype != dtype
                or not residual.is_contiguous() or self.first_norm.dtype != dtype
                or not self._fill(dtype, kv)):
            return None
        rows_info, rows_ptrs = backend.stack_rows()
        cos, sin = (t.contiguous() for t in ctx.rope)
        slots = ctx.batch.slot_mapping.to(torch.int64).contiguous()
        out = torch.empty_like(residual)
        block_size = kv.k[0].shape[1]
        cpu_kernels.decoder_stack(self.table, self.num_layers, self.first_norm, residual, out, n, self.hidden,
                                  self.hq, self.hkv, self.d, self.inter, block_size, self.eps, self.scale, cos, sin,
                                  slots, rows_info, rows_ptrs)
        return out

