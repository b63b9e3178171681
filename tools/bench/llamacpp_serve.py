"""llama.cpp's C++ server run in-process by the xllamacpp wheel, started like `llama-server`.

    .bench/llamacpp-venv/bin/python tools/bench/llamacpp_serve.py -m MODEL.gguf --port 8080 -np 16 -c 27936 \\
        -t 2 -tb 2 --kv-unified -ctk f32 -ctv f32 --no-cache-prompt -cram 0 --metrics --alias smollm2

The flags are llama-server's own (the subset the suites pass), so a suite starts this launcher and a
native `llama-server` with the same command line (bench.peer_llamacpp). It runs in the llama.cpp venv of
tools/setup_llamacpp.sh, never in mstar's: it imports xllamacpp and nothing of this repository. Before
serving it prints llama-server's `system_info:` line (threads, then the CPU features the wheel was built
with), which a native llama-server prints only at `-lv 4`; it serves until SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import signal
import threading

KV_TYPES = ("f32", "f16", "bf16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-a", "--alias", default=None)
    p.add_argument("-np", "--parallel", type=int, default=1, help="server slots")
    p.add_argument("-c", "--ctx-size", type=int, default=0)
    p.add_argument("-t", "--threads", type=int, default=-1)
    p.add_argument("-tb", "--threads-batch", type=int, default=-1)
    p.add_argument("-kvu", "--kv-unified", action="store_true")
    p.add_argument("-ctk", "--cache-type-k", choices=KV_TYPES, default="f16")
    p.add_argument("-ctv", "--cache-type-v", choices=KV_TYPES, default="f16")
    p.add_argument("--cache-prompt", dest="cache_prompt", action="store_true", default=True)
    p.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false")
    p.add_argument("-cram", "--cache-ram", type=int, default=None, help="MiB of host prompt cache (0: none)")
    p.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false", default=True)
    p.add_argument("--metrics", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import xllamacpp as xlc

    args = parse_args(argv)
    params = xlc.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads_batch
    params.kv_unified = args.kv_unified
    params.cache_type_k = getattr(xlc.ggml_type, f"GGML_TYPE_{args.cache_type_k.upper()}")
    params.cache_type_v = getattr(xlc.ggml_type, f"GGML_TYPE_{args.cache_type_v.upper()}")
    params.cache_prompt = args.cache_prompt
    if args.cache_ram is not None:
        params.cache_ram_mib = args.cache_ram
    params.cache_idle_slots = args.cache_idle_slots
    params.endpoint_metrics = args.metrics
    if args.alias:
        params.model_alias = {args.alias}
    print(f"system_info: n_threads = {args.threads} (n_threads_batch = {args.threads_batch}) / {os.cpu_count()} | "
          f"{xlc.get_system_info()}", flush=True)
    print(f"xllamacpp {xlc.__version__}: cache_prompt = {params.cache_prompt}, cache_ram_mib = {params.cache_ram_mib}, "
          f"kv_unified = {params.kv_unified}, n_parallel = {params.n_parallel}, n_ctx = {params.n_ctx}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = xlc.Server(params)
    print(f"listening at {server.listening_address}", flush=True)
    stop.wait()


if __name__ == "__main__":
    main()
