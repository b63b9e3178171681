"""Decode throughput of the paged-KV decoder against a dense-cache baseline of the same model.

    python tools/bench_paged_decode.py [--preset smollm2-135m] [--batches 1 4 16 64] [--steps 8]
    python tools/bench_paged_decode.py --device cuda --dtype bf16 --backend triton   # + CUDA graphs

Both paths share every weight and module (embedding, QKV/RoPE projection, MLP, norms,
LM head) and differ only in the KV cache and attention: the paged path is the runtime's
`DecoderLM.forward` over a `PagedKVCache` with block tables rebuilt every step by the
`KVBlockManager` (as a worker does); the dense path keeps one contiguous
(B, kv_heads, max_len, head_dim) tensor per layer and calls SDPA on its prefix. On CUDA a
third path replays the paged decode step as a CUDA graph (`runtime.model_executor.compiled.DecodeGraphs`,
captured for the batch size), reading the sampled tokens back to the host every step as
a worker does. Each batch prefills a prompt (untimed), then times `--repeats` segments
of `--steps` greedy decode steps per path, alternating paths; the figure is the median
segment. Random weights (seeded): speed does not depend on their values.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class
from runtime.model_executor.compiled import DecodeGraphs
from runtime.model_executor.kv import KVBlockManager
from runtime.model_executor.layers import DecoderLM
from runtime.model_executor.parallel.cpu_linear import device_of

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DenseCache:
    """The baseline: contiguous per-layer K/V for a static batch, SDPA over the filled prefix."""

    def __init__(self, model: DecoderLM, batch: int, max_len: int) -> None:
        c = model.config
        shape = (batch, c.num_kv_heads, max_len, c.head_dim)
        weight = model.model.embed_tokens.weight
        self.model = model
        self.k = [torch.zeros(shape, dtype=weight.dtype, device=device_of(model)) for _ in range(c.num_layers)]
        self.v = [torch.zeros(shape, dtype=weight.dtype, device=device_of(model)) for _ in range(c.num_layers)]
        self.length = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) at positions length .. length+T-1 -> final-normed hidden of the last position (B, hidden)."""
        b, t = ids.shape
        positions = torch.arange(self.length, self.length + t, device=ids.device).repeat(b)   # (B*T,)
        hidden = self.model.model.embed_tokens(ids.flatten())
        for i, layer in enumerate(self.model.model.layers):
            hidden = hidden + self._attend(layer.self_attn, i, layer.input_layernorm(hidden), positions, b, t)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.length += t
        return self.model.model.norm(hidden.view(b, t, -1)[:, -1])

    def _attend(self, attn, i: int, hidden: torch.Tensor, positions: torch.Tensor, b: int, t: int) -> torch.Tensor:
        q, k, v = attn.project(hidden, positions)                       # (B*T, H, D)
        end = self.length + t
        self.k[i][:, :, self.length:end] = k.view(b, t, *k.shape[1:]).transpose(1, 2)
        self.v[i][:, :, self.length:end] = v.view(b, t, *v.shape[1:]).transpose(1, 2)
        q = q.view(b, t, *q.shape[1:]).transpose(1, 2)                   # (B, Hq, T, D)
        o = F.scaled_dot_product_attention(q, self.k[i][:, :, :end], self.v[i][:, :, :end],
                                           is_causal=t > 1, enable_gqa=True)
        return attn.o_proj(o.transpose(1, 2).reshape(b * t, -1))


class DensePath:
    """Decode with the dense baseline cache."""

    def __init__(self, model: DecoderLM, prompts: torch.Tensor, max_len: int) -> None:
        self.model = model
        self.cache = DenseCache(model, prompts.shape[0], max_len)
        self.token = model.compute_logits(self.cache.forward(prompts)).argmax(-1)

    def decode(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.token = self.model.compute_logits(self.cache.forward(self.token[:, None])).argmax(-1)
        return _elapsed(start, self.token)


class PagedPath:
    """Decode through the runtime's paged cache: block tables and metadata rebuilt every step."""

    def __init__(self, model: DecoderLM, prompts: torch.Tensor, max_len: int, block_size: int) -> None:
        b, p = prompts.shape
        num_blocks = b * -(-max_len // block_size)
        self.model, self.device = model, prompts.device
        self.manager, self.cache = KVBlockManager(num_blocks, block_size), model.make_kv_cache(num_blocks, block_size)
        for r in range(b):
            self.manager.allocate(r, p)
        batch = self.manager.metadata([(r, p) for r in range(b)], device=self.device)
        hidden = model(prompts.flatten(), torch.arange(p, device=self.device).repeat(b), batch, self.cache)
        self.token = model.compute_logits(hidden[batch.last_token_rows()]).argmax(-1)

    def decode(self, steps: int) -> float:
        start = time.perf_counter()
        reqs = range(self.token.shape[0])
        for _ in range(steps):
            positions = torch.tensor([self.manager.num_tokens(r) for r in reqs], device=self.device)
            for r in reqs:
                self.cache.copy_blocks(self.manager.append(r, 1))
            batch = self.manager.metadata([(r, 1) for r in reqs], device=self.device)
            self.token = self.model.compute_logits(self.model(self.token, positions, batch, self.cache)).argmax(-1)
        return _elapsed(start, self.token)


class GraphPath(PagedPath):
    """The paged decode step replayed as a CUDA graph captured for this batch size."""

    def __init__(self, model: DecoderLM, prompts: torch.Tensor, max_len: int, block_size: int) -> None:
        super().__init__(model, prompts, max_len, block_size)
        self.graphs = DecodeGraphs(model, self.cache, [prompts.shape[0]], -(-max_len // block_size))
        self.graphs.capture_all()
        self.tokens = self.token.tolist()

    def decode(self, steps: int) -> float:
        start = time.perf_counter()
        reqs = range(len(self.tokens))
        for _ in range(steps):
            for r in reqs:
                self.cache.copy_blocks(self.manager.append(r, 1))
            tables = [self.manager.table(r) for r in reqs]
            logits, _ = self.graphs.run(self.tokens, [t.blocks for t in tables], [t.num_tokens for t in tables])
            self.tokens = logits.argmax(-1).tolist()     # the host needs the tokens: a sync, as in a worker
        return time.perf_counter() - start


def _elapsed(start: float, last: torch.Tensor) -> float:
    if last.is_cuda:
        torch.cuda.synchronize(last.device)
    return time.perf_counter() - start


def measure(model: DecoderLM, prompts: torch.Tensor, steps: int, repeats: int, block_size: int) -> list[float]:
    """Median seconds per segment of `steps` decode steps per path — paged, dense (and CUDA
    graphs on CUDA) — segments alternating between paths so that load on a shared machine
    hits all alike."""
    max_len = prompts.shape[1] + steps * (repeats + 1)
    paths = [PagedPath(model, prompts, max_len, block_size), DensePath(model, prompts, max_len)]
    if prompts.is_cuda:
        paths.append(GraphPath(model, prompts, max_len, block_size))
    for path in paths:
        path.decode(steps)                         # warm-up segment
    times = [[path.decode(steps) for path in paths] for _ in range(repeats)]
    return [statistics.median(segment[i] for segment in times) for i in range(len(paths))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="llama_lm")
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--backend", default="torch", help="attention backend of the paged path")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda adds the CUDA-graph path)")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dims = load_catalogue()[args.kind].presets[args.preset]
    model = component_class(args.kind)(dims, {"seed": 0, "attention_backend": args.backend})
    model = model.to(args.device, DTYPES[args.dtype]).eval()
    print(f"{args.kind}:{args.preset}  prompt {args.prompt_len}  {args.steps} decode steps  median of {args.repeats}"
          f"  threads {torch.get_num_threads()}  backend {args.backend}  {args.device} {args.dtype}")
    graphs = args.device.startswith("cuda")
    print(f"{'batch':>5} | {'paged tok/s':>11} | {'dense tok/s':>11} | {'paged/dense':>11}"
          + (f" | {'graph tok/s':>11} | {'graph/paged':>11}" if graphs else ""))
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for b in args.batches:
            prompts = torch.randint(0, dims["vocab_size"], (b, args.prompt_len), generator=gen).to(args.device)
            paged, dense, *graph = measure(model, prompts, args.steps, args.repeats, args.block_size)
            tok = b * args.steps
            line = f"{b:>5} | {tok / paged:>11.1f} | {tok / dense:>11.1f} | {dense / paged:>10.2f}x"
            if graph:
                line += f" | {tok / graph[0]:>11.1f} | {paged / graph[0]:>10.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
