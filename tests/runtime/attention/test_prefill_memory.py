"""A prefill's memory grows linearly with the prompt: no (heads x T x T) score matrix.

One whole-prompt prefill of a tiny llama at 2,048 and at 8,192 tokens, peak bytes
allocated during the forward (the profiler's allocator events: deterministic, whatever
else the machine runs). Everything a prefill must hold grows linearly in T (hidden
states, q/k/v, the MLP's intermediate rows, the gathered keys and values), so 4x the
prompt may cost at most 4x the bytes; the 4.5x bound leaves 12 % for rounding of the
fused kernel's blocks. A score matrix would grow 16x, and at 8k tokens it alone
(heads x T x T fp32 = 1 GiB) would be far above the absolute bound checked too.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, build, peak_allocated_bytes, tiny_dims

SHORT, LONG = 2048, 8192


def _prefill(model, num_tokens: int):
    runner = PagedRunner(model, num_blocks=num_tokens // 16, block_size=16)
    runner.manager.allocate("r", 0)
    runner.cache.copy_blocks(runner.manager.append("r", num_tokens))
    batch = runner.manager.metadata([("r", num_tokens)])
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(0))

    def prefill() -> None:
        with torch.no_grad():
            hidden = model(ids, torch.arange(num_tokens), batch, runner.cache)
            model.compute_logits(hidden[batch.last_token_rows()])
    return prefill


def _prefill_peak(model, num_tokens: int) -> int:
    return peak_allocated_bytes(_prefill(model, num_tokens))


def test_prefill_peak_memory_grows_linearly_with_the_prompt() -> None:
    dims = tiny_dims("llama_lm", num_hidden_layers=1, max_position_embeddings=LONG)
    model = build("llama_lm", dims)
    short, long = _prefill_peak(model, SHORT), _prefill_peak(model, LONG)
    assert long <= 4.5 * short, f"peak {short / 2**20:.1f} MiB at {SHORT} tokens, {long / 2**20:.1f} MiB at {LONG}"
    scores = dims["num_attention_heads"] * LONG * LONG * 4        # one fp32 score matrix of the long prompt
    assert long < scores / 8


_RSS_SCRIPT = """
import resource, sys, torch
from tests.runtime.attention.test_prefill_memory import SHORT, LONG, _prefill
from tests.runtime.models.decoder_lm.lm_factories import build, tiny_dims
from runtime.model_executor.kernels import cpu as cpu_kernels
assert cpu_kernels.status() == "", cpu_kernels.status()
model = build("llama_lm", tiny_dims("llama_lm", num_hidden_layers=1, max_position_embeddings=LONG), backend="cpu")
assert model.attention_backend(torch.device("cpu")).name == "cpu"
peaks = []
for n in (SHORT, LONG):
    _prefill(model, n)()
    peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(*peaks, tiny_dims("llama_lm")["num_attention_heads"])
"""


def test_the_fused_prefill_kernels_memory_grows_linearly_too() -> None:
    """The CPU backend's prefill kernel holds its buffers (the keys transposed into tiles, each thread's
    tile state) outside torch's allocator, so the profiler above cannot see them: here the process's peak
    RSS in a fresh interpreter, after the short prompt and after the long one. What the long prompt adds is
    linear (tens of MiB for this tiny model); one score matrix of it would add heads x T x T x 4 bytes (1 GiB)."""
    done = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    short, long, heads = (int(x) for x in done.stdout.split())
    scores = heads * LONG * LONG * 4
    assert long - short < scores / 8, f"peak RSS {short / 2**20:.0f} MiB at {SHORT} tokens, {long / 2**20:.0f} at {LONG}"
