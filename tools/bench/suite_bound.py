"""bound: SmolLM2-135M decode step time at batch 1, 16 and 64 against this machine's roofline (suite_bound_3b.py:
the same rows for Orpheus-3B's LM at its published shapes).

The roofline: a step's floor is the larger of its weight-streaming bound and its compute floor (both below,
both measured in the same run); each batch gets a row of the step against that floor, per round.

A decode step must read every weight once (the tied embedding once, as the LM head), so
no step can be faster than `weight bytes / memory read bandwidth`. Both are measured here,
in the same run, alternating round by round:
  mstar: one greedy decode step of the batch (after a 32-token prefill) through the
         `lm` node of graphs/smollm2.yaml loaded by the worker's loader in this process
         (the `linear` suite's `Decoder`, linears packed for the GEMM MSTAR_CPU_LINEAR=auto picks), ms per step;
  bound: the model's unique parameter bytes (in the plan's dtype) divided by the read
         bandwidth of one `torch.sum` over a tensor 8x the L2+L3 size of any server CPU
         (`BANDWIDTH_BYTES`, so it streams from DRAM), on the same threads. A shared VM's read
         bandwidth can change by 2x within minutes (docs/benchmark-log.md), so the sides alternate
         round by round and the bound and the step see the same state.
"A's advantage" is bound / step: 1.0 would be a step at the bound. The KV cache reads
(batch x context x layers x 2 x kv width) are left out of the bound: at a 32..64-token
context they are small beside the weights.

A second row per case says how much of the gap the GEMM kernel itself leaves: the same
step's GEMMs alone (every packed linear of the model and the LM head, in model order, on
inputs of the batch's rows and their widths, through `runtime.model_executor.parallel.cpu_linear.linear`
as the model calls them, no other op), against the same bound. What the step spends beyond
its GEMMs is the first row's figure minus this one.

A third row sets the GEMMs against the other floor a step has, compute: their FLOPs
(2 x batch x in x out, summed) at the rate torch.mm (MKL / oneDNN) multiplies two
`PEAK_SIZE`-square matrices that stay in cache, on the same threads, in the same run: in the
step's dtype or in fp32, whichever is faster (a CPU without bf16 instructions emulates torch's bf16
product at a few GFLOP/s, and a bf16 GEMM there computes in fp32 after an exact conversion, as
mstar's AVX2 kernel does: the dtype's own rate would put the floor far above any real step). At
batch 1 the bandwidth bound is the higher floor; as the batch grows the compute floor overtakes it,
and the roofline row (the first of each case) holds the step against whichever is higher in that
round.
"""
from __future__ import annotations

import statistics
import time

import torch

from bench.registry import Context, register
from bench.results import Row, Side
from bench.stats import LOWER, median_time
from bench.peer_mstar import mstar_plan
from bench.suite_linear import Decoder

BATCHES, STEPS, QUICK_STEPS = (1, 16, 64), 16, 4
BANDWIDTH_BYTES = 1 << 30          # 1 GiB: far past any last-level cache, so the sum reads DRAM
SUMS = 5                           # timed sums per sample (the median is kept)
PEAK_SIZE, PEAK_PRODUCTS = 512, 20  # torch.mm operands (1 MiB fp32 each: cache-resident), products per timing
MSTAR = "mstar decode step (lm node of graphs/smollm2.yaml, worker loader, packed linears, fused CPU kernels)"
BOUND = "weight bytes / measured read bandwidth (torch.sum over 1 GiB, same threads, same run)"
GEMMS = "the same step's GEMMs alone: every packed linear and the LM head on the batch's inputs, no other op"
ROOFLINE = "the roofline floor: the larger of the bandwidth bound and the compute floor, per round (same run)"
FLOOR = f"their FLOPs at torch.mm's rate on cache-resident {PEAK_SIZE}x{PEAK_SIZE} matrices " \
        "(the step's dtype or fp32, whichever is faster; same threads, same run)"


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of weights the module holds: its distinct parameter and buffer storages (a tied weight counts once;
    the meta stand-ins of packed weights count nothing) and its packed copies (each such weight's only one)."""
    seen: dict[int, int] = {}
    for t in [*module.parameters(), *module.buffers(), *_packed_copies(module)]:
        if t.device.type == "meta":
            continue
        try:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except NotImplementedError:      # oneDNN's blocked copy is opaque: a tensor of its own
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _packed_copies(module: torch.nn.Module) -> list[torch.Tensor]:
    out = []
    for m in module.modules():
        packed = getattr(m, "packed", None)
        if isinstance(packed, torch.Tensor):
            out.append(packed)
        elif isinstance(packed, list):          # a mixture of experts: (gate_up, down) per expert
            out += [t for pair in packed for t in pair]
    return out


def read_bandwidth(buffer: torch.Tensor) -> float:
    """Bytes per second of a streaming read: the median of `SUMS` sums over `buffer`."""
    return buffer.numel() * buffer.element_size() / median_time(buffer.sum, SUMS)


def gemm_rate(dtype: torch.dtype) -> float:
    """FLOP/s of torch.mm on two `PEAK_SIZE`-square matrices of `dtype` that stay in cache: the median of `SUMS`
    timings of `PEAK_PRODUCTS` products."""
    a, b = torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype), torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype)
    torch.mm(a, b)

    def products() -> None:
        for _ in range(PEAK_PRODUCTS):
            torch.mm(a, b)
    return 2 * PEAK_SIZE ** 3 * PEAK_PRODUCTS / median_time(products, SUMS)


def gemm_flops(gemms: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]], batch: int) -> int:
    """FLOPs of running `gemms` once each on `batch` rows: 2 x batch x in x out, summed."""
    return sum(2 * batch * weight.shape[0] * weight.shape[1] for weight, _, _ in gemms)


def step_gemms(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """(weight, bias, packed weight) of every linear a decode step of `model` runs, in model
    order: the packed linears (runtime.model_executor.parallel.cpu_linear) and the LM head (its table)."""
    gemms = []
    for module in model.modules():
        packed = getattr(module, "packed", None)
        if isinstance(packed, (torch.Tensor, tuple)):   # an MoE layer keeps a list per expert: not a dense step's GEMM
            weight = module.table() if callable(getattr(module, "table", None)) else module.weight
            gemms.append((weight, getattr(module, "bias", None), packed))
    return gemms


def gemms_ms(gemms: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]], batch: int, steps: int) -> float:
    """ms per step of running `gemms` once each on (batch, in_features) inputs, as the model calls them."""
    from runtime.model_executor.parallel.cpu_linear import linear
    xs = [torch.randn(batch, weight.shape[1], dtype=weight.dtype) for weight, _, _ in gemms]
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(steps):
            for x, (weight, bias, packed) in zip(xs, gemms):
                linear(x, weight, bias, packed)
        return 1e3 * (time.perf_counter() - start) / steps


def _bound(nbytes: int, buffer: torch.Tensor) -> dict[str, float]:
    bandwidth = read_bandwidth(buffer)
    return {"ms": 1e3 * nbytes / bandwidth, "gb_s": bandwidth / 1e9}


def _floor(flops: int, dtype: torch.dtype) -> dict[str, float]:
    """The compute floor of `flops`: at torch.mm's rate in `dtype` or in fp32, whichever is faster (module doc)."""
    rate = max(gemm_rate(dtype), gemm_rate(torch.float32))
    return {"ms": 1e3 * flops / rate, "gflop_s": rate / 1e9}


def _rows(ctx: Context, dtype: str, decoder: Decoder, steps: int, batch: int, label: str = MSTAR,
          model_name: str = "") -> list[Row]:
    model = decoder.model
    nbytes, gemms = weight_bytes(model), step_gemms(model)
    flops = gemm_flops(gemms, batch)
    buffer = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    decoder.decode(batch, 2)                  # warm-up: first calls pick and cache kernels
    gemms_ms(gemms, batch, 1)
    samples = ctx.alternate(f"bound {dtype} batch {batch}", {
        "mstar": lambda: {"ms": 1e3 * batch / decoder.decode(batch, steps)[1]},
        "gemms": lambda: {"ms": gemms_ms(gemms, batch, steps)},
        "bound": lambda: _bound(nbytes, buffer),
        "floor": lambda: _floor(flops, getattr(torch, dtype))}, warmup=0)
    del buffer
    gb_s = statistics.median(samples["bound"]["gb_s"])
    bound_ms, floor_ms = statistics.median(samples["bound"]["ms"]), statistics.median(samples["floor"]["ms"])
    step_ms, gflop_s = statistics.median(samples["mstar"]["ms"]), statistics.median(samples["floor"]["gflop_s"])
    roof = [max(b, f) for b, f in zip(samples["bound"]["ms"], samples["floor"]["ms"])]
    label += ", decode steps compiled (cpu_compile)" if ctx.cpu_compile else ""
    note = f"{nbytes / 1e6:.0f} MB of weights, median read bandwidth {gb_s:.1f} GB/s; advantage = bound / step " \
           "(1.0 = at the bound)"
    higher = "compute" if floor_ms > bound_ms else "bandwidth"
    roofline = f"{flops / 1e9:.2f} GFLOP of GEMMs at {gflop_s:.0f} GFLOP/s: compute floor {floor_ms:.2f} ms " \
               f"against the bandwidth bound's {bound_ms:.2f} ms ({higher} is the higher floor; 1.5x the bound " \
               f"is {1.5 * bound_ms:.2f} ms); the step is {step_ms / max(floor_ms, bound_ms):.2f}x the higher floor"
    bound, case = Side(BOUND, samples["bound"]["ms"]), f"{model_name}{dtype}, batch {batch}"
    return [Row(f"{case}, against the roofline", "decode step time", "ms", LOWER,
                Side(label, samples["mstar"]["ms"]), Side(ROOFLINE, roof), names=("mstar", "roofline"),
                plot="roofline", x=f"{dtype} b{batch}", xlabel="dtype, batch",
                note=f"{roofline}; advantage = floor / step (1.0 = at the floor)"),
            Row(case, "decode step time", "ms", LOWER, Side(label, samples["mstar"]["ms"]),
                bound, names=("mstar", "bound"), plot="bound", x=f"{dtype} b{batch}", xlabel="dtype, batch",
                note=f"{note}; {roofline}"),
            Row(f"{case}, its GEMMs alone", "GEMM time of one decode step", "ms", LOWER,
                Side(GEMMS, samples["gemms"]["ms"]), bound, names=("GEMMs", "bound"), plot="bound-gemms",
                x=f"{dtype} b{batch}", xlabel="dtype, batch",
                note=f"{len(gemms)} GEMMs (the linears and the LM head); {note}"),
            Row(f"{case}, its GEMMs vs the compute floor", "GEMM time of one decode step", "ms", LOWER,
                Side(GEMMS, samples["gemms"]["ms"]), Side(FLOOR, samples["floor"]["ms"]),
                names=("GEMMs", "compute floor"), plot="bound-compute", x=f"{dtype} b{batch}", xlabel="dtype, batch",
                note=f"{roofline}; advantage = floor / GEMMs (1.0 = the GEMMs at torch.mm's cache-resident rate)")]


def record_settings(ctx: Context, batches: tuple[int, ...], steps: int) -> int:
    """The run's batches, steps per sample and measuring constants, into the result's settings; returns `steps`."""
    ctx.settings.update(batches=list(batches), steps=steps, bandwidth_bytes=BANDWIDTH_BYTES,
                        threads=torch.get_num_threads(), peak_size=PEAK_SIZE, peak_products=PEAK_PRODUCTS)
    return steps


@register("bound", "SmolLM2 decode step at batch 1, 16 and 64 vs the roofline (weight bytes / read bandwidth, "
                   "GEMM FLOPs / torch.mm's rate)")
def run(ctx: Context) -> list[Row]:
    steps = record_settings(ctx, BATCHES, QUICK_STEPS if ctx.quick else STEPS)
    rows = []
    for dtype in ("float32", "bfloat16"):
        decoder = Decoder(mstar_plan(ctx, dtype), packed=True)
        rows += [row for batch in BATCHES for row in _rows(ctx, dtype, decoder, steps, batch)]
    return rows

