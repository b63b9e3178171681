"""Weight-only quantized linears (runtime/model_executor/parallel/quant.py) against oracles written here.

The oracles de-quantise from the scheme's definition (int8: code x scale; int4: (code - 8) x scale + zero)
with the codes and scales the test itself holds, in float64, never through the kernels under test; a
weight's packed int4 codes are read back through a one-hot input, checked first against the codes the
test packed (test_int4_packing_round_trips).
"""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.catalogue import load_catalogue
from mstar_compiler.quant import weight_bytes, why_not
from runtime.model_executor.components import component_class
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.parallel.quant import QuantWeight, int4_weight, int8_weight, quantize, quantized_weights
from runtime.worker.loader import cast_as_built

FP32_EPS = 2.0 ** -24
BF16_EPS = 2.0 ** -8


def _weights(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * 0.05 + torch.randn(n, 1, generator=gen) * 0.01


def _read_back(q: QuantWeight) -> torch.Tensor:
    """The (n, k) weight the kernel multiplies by, read through one-hot fp32 rows (exact: each output is
    one weight times 1 plus zeros)."""
    assert q.dtype == torch.float32
    return q.matmul(torch.eye(q.k)).t()


def _int4_oracle(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    n, k = codes.shape
    groups = (codes.double().view(n, k // 32, 32) - 8) * scale.double()[..., None] + zero.double()[..., None]
    return groups.view(n, k)


def test_int4_packing_round_trips():
    n, k = 96, 256
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scale = torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3
    zero = torch.randn(n, k // 32, generator=gen) * 0.02
    back = _read_back(int4_weight(codes, scale, zero)).double()
    want = _int4_oracle(codes, scale, zero)
    # (q - 8) * s + z in fp32: at most two roundings (one if the kernel fuses the multiply-add), each half an
    # ulp of a value no larger than 8|s| + |z|
    bound = 2 * FP32_EPS * (8 * scale.double().abs() + zero.double().abs()).repeat_interleave(32, dim=1)
    assert ((back - want).abs() <= bound).all()


def test_int8_codes_are_the_nearest_step_of_their_channel():
    w = _weights(64, 160, seed=2)
    q = quantize(w, "int8")
    assert q.data.dtype == torch.int8 and q.scales.shape == (64,)
    step = q.scales.double()[:, None]
    assert torch.equal(w.abs().argmax(dim=1), q.data.abs().argmax(dim=1))
    assert (q.data.abs().amax(dim=1) == 127).all()                # each channel's largest weight is +-127 steps
    # round to nearest: within half a step, plus the fp32 rounding of w / scale (a relative 2^-24)
    assert ((q.data.double() * step - w.double()).abs() <= step * (0.5 + 127 * FP32_EPS)).all()
    again = quantize(w.clone(), "int8")
    assert torch.equal(again.data, q.data) and torch.equal(again.scales, q.scales)


def test_int4_quantize_is_within_half_a_step_of_each_group():
    w = _weights(48, 192, seed=3)
    q = quantize(w, "int4_g32")
    groups = w.double().view(48, 6, 32)
    step = ((groups.amax(dim=2) - groups.amin(dim=2)) / 15)[..., None]
    err = (_read_back(q).double().view(48, 6, 32) - groups).abs()
    # half a step from rounding; the zero (min + 8 step) and the scale carry fp32 roundings of a relative
    # 2^-24 of values up to |min| + 15 step
    slack = 4 * FP32_EPS * (groups.abs().amax(dim=2, keepdim=True) + 15 * step)
    assert (err <= step / 2 + slack).all()
    again = quantize(w.clone(), "int4_g32")
    assert torch.equal(again.data, q.data) and torch.equal(again.scales, q.scales)


def _codes(w: torch.Tensor, scheme: str, dtype: torch.dtype):
    """The scheme's codes, scales (and zeros) by its definition (module doc of quant.py), computed here."""
    if scheme == "int8":
        scale = (w.abs().amax(dim=1) / 127).to(dtype)
        return torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8), scale, None
    n, k = w.shape
    groups = w.view(n, k // 32, 32)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).to(dtype)
    zero = (low + 8 * scale.float()).to(dtype)
    codes = (torch.round((groups - zero.float()[..., None]) / scale.float()[..., None]) + 8).clamp(0, 15)
    return codes.view(n, k).to(torch.uint8), scale, zero


KERNELS = [("torch", torch.float32), ("torch", torch.bfloat16), ("amx", torch.bfloat16)]


@pytest.mark.parametrize("scheme", ["int8", "int4_g32"])
@pytest.mark.parametrize("kernel, dtype", KERNELS, ids=[f"{k}-{'fp32' if d == torch.float32 else 'bf16'}"
                                                        for k, d in KERNELS])
@pytest.mark.parametrize("rows", [1, 5, 16, 37])
def test_linear_matches_the_dequantised_weight(monkeypatch, scheme, kernel, dtype, rows):
    if kernel == "amx" and not cpu_kernels.quant_amx():
        pytest.skip(f"no AMX-BF16 tiles on this CPU ({cpu_kernels.status() or 'kernels built'}): torch's kernels run")
    monkeypatch.setenv("MSTAR_CPU_QUANT", kernel)
    n, k = 80, 256
    codes, scale, zero = _codes(_weights(n, k, seed=4), scheme, dtype)
    q = int8_weight(codes, scale) if scheme == "int8" else int4_weight(codes, scale, zero)
    assert q.kernel == kernel
    deq = codes.double() * scale.double()[:, None] if scheme == "int8" else _int4_oracle(codes, scale, zero)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = x.double() @ deq.t()
    got = q.matmul(x).double()
    assert got.shape == (rows, n) and q.matmul(x.view(1, rows, k)).shape == (1, rows, n)
    magnitude = x.double().abs() @ deq.abs().t()
    # fp32 accumulation over k terms (a relative k * 2^-24 of sum |x w| at worst); bf16 adds the rounding of
    # the de-quantised weight and of the output to bf16, each a relative 2^-8
    eps = k * FP32_EPS if dtype == torch.float32 else k * FP32_EPS + 2 * BF16_EPS
    assert ((got - want).abs() <= eps * magnitude + 1e-12).all()   # 1e-12: a zero sum leaves only float64 rounding


def test_an_input_of_another_dtype_is_refused():
    q = quantize(_weights(32, 64, seed=6), "int8", torch.bfloat16)
    with pytest.raises(RuntimeError, match="float32 input .* int8 linear quantized for torch.bfloat16"):
        q.matmul(torch.randn(2, 64))


def test_int4_refuses_a_partial_group():
    with pytest.raises(ValueError, match="whole groups of 32.*40"):
        quantize(_weights(16, 40, seed=7), "int4_g32")


CATALOGUE = load_catalogue()
QUANT_KINDS = [(spec.kind, preset) for spec in CATALOGUE.specs() if spec.quant_linears is not None
               for preset in spec.presets if preset == "tiny" or preset.endswith("-tiny")]


@pytest.mark.parametrize("scheme", ["int8", "int4_g32"])
@pytest.mark.parametrize("kind, preset", QUANT_KINDS, ids=[f"{k}:{p}" for k, p in QUANT_KINDS])
def test_the_memory_plan_counts_the_bytes_the_module_holds(kind, preset, scheme):
    """mstar_compiler.quant's bytes (from the catalogue's quant_linears) are what the built module keeps:
    its dense parameters plus its quantized weights, and every quantizable linear is quantized."""
    spec = CATALOGUE[kind]
    dims = spec.presets[preset]
    if why_not(spec, dims, scheme):      # the compiler refuses it (a weight with a partial group): so does the module
        with pytest.raises(ValueError, match="whole groups of 32"), cast_as_built(torch.bfloat16, scheme):
            component_class(kind)(dims, dict(spec.args))
        return
    with cast_as_built(torch.bfloat16, scheme):
        module = component_class(kind)(dims, dict(spec.args))
    quantized = quantized_weights(module)
    assert quantized and all(isinstance(q, QuantWeight) and q.scheme == scheme for q in quantized)
    dense = sum(p.numel() * p.element_size() for p in module.parameters() if p.device.type != "meta")
    held = dense + sum(q.nbytes for q in quantized)
    assert held == weight_bytes(spec, dims, 2, scheme)
    expected = sum(lin.count for lin in spec.quant_linears(dims))
    assert len(quantized) == expected


def _dequantised(q: QuantWeight) -> torch.Tensor:
    """What a quantized weight stands for: int8 codes x scales as stored; int4 read back (the read-back is
    checked against held codes by test_int4_packing_round_trips)."""
    return q.data.float() * q.scales.float()[:, None] if q.scheme == "int8" else _read_back(q)


def _dense_twin(kind: str, dims: dict, quantized: torch.nn.Module) -> torch.nn.Module:
    """The same seeded model unquantized, each quantized weight replaced by its de-quantised values."""
    from runtime.model_executor.layers.moe import SparseMoE
    from runtime.model_executor.parallel import ColumnParallelLinear, RowParallelLinear

    dense = component_class(kind)(dims, {"seed": 3, "attention_backend": "torch"}).eval()
    twins = dict(quantized.named_modules())
    with torch.no_grad():
        for name, module in dense.named_modules():
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                module.weight.copy_(_dequantised(twins[name].packed))
            elif isinstance(module, SparseMoE):
                for e, (gate_up, down) in enumerate(twins[name].packed):
                    module.experts.gate_up_proj[e].copy_(_dequantised(gate_up))
                    module.experts.down_proj[e].copy_(_dequantised(down))
    return dense


@pytest.mark.parametrize("scheme", ["int8", "int4_g32"])
@pytest.mark.parametrize("kind", ["llama_lm", "qwen2_lm", "qwen3_lm", "qwen3_moe_lm"])
def test_quantized_logits_match_the_model_dequantised_on_the_same_values(kind, scheme):
    """Prefill and decode over a paged cache (the tensor-parallel test's mixed schedule): the quantized model
    against its de-quantised fp32 twin. Only the GEMMs' summation order differs."""
    from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, tiny_dims
    from tests.runtime.parallel.tp_worker import SCHEDULE

    dims = tiny_dims(kind)
    with cast_as_built(torch.float32, scheme):
        quantized = component_class(kind)(dims, {"seed": 3, "attention_backend": "torch"}).eval()
    dense = _dense_twin(kind, dims, quantized)
    runners = PagedRunner(quantized, num_blocks=32, block_size=4), PagedRunner(dense, num_blocks=32, block_size=4)
    with torch.no_grad():
        got, want = ([torch.cat(runner.step(chunks)) for chunks in SCHEDULE] for runner in runners)
    for a, b in zip(got, want):
        # fp32 GEMMs summed in another order (torch's quantized kernels against MKL): a few ulps (eps 1.2e-7)
        # per layer on logits |l| <= 1, as the tensor-parallel test's bound
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["int8", "int4_g32"])
def test_amx_rows_do_not_depend_on_their_batch(monkeypatch, scheme):
    """On AMX tiles each row's sums are its own: a row alone, and the same row among 37 others (three row tiles),
    give the same bits (the batch-invariance the decode path relies on)."""
    if not cpu_kernels.quant_amx():
        pytest.skip(f"no AMX-BF16 tiles on this CPU ({cpu_kernels.status() or 'kernels built'}): torch's kernels run")
    monkeypatch.setenv("MSTAR_CPU_QUANT", "amx")
    q = quantize(_weights(96, 320, seed=8), scheme, torch.bfloat16)
    x = torch.randn(38, 320, generator=torch.Generator().manual_seed(9)).bfloat16()
    batch = q.matmul(x)
    for row in (0, 15, 16, 37):
        assert torch.equal(q.matmul(x[row:row + 1]), batch[row:row + 1])
