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

import torch

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, build, peak_allocated_bytes, tiny_dims

SHORT, LONG = 2048, 8192


def _prefill_peak(model, num_tokens: int) -> int:
    runner = PagedRunner(model, num_blocks=num_tokens // 16, block_size=16)
    runner.manager.allocate("r", 0)
    runner.cache.copy_blocks(runner.manager.append("r", num_tokens))
    batch = runner.manager.metadata([("r", num_tokens)])
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(0))

    def prefill() -> None:
        with torch.no_grad():
            hidden = model(ids, torch.arange(num_tokens), batch, runner.cache)
            model.compute_logits(hidden[batch.last_token_rows()])
    return peak_allocated_bytes(prefill)


def test_prefill_peak_memory_grows_linearly_with_the_prompt() -> None:
    dims = tiny_dims("llama_lm", num_hidden_layers=1, max_position_embeddings=LONG)
    model = build("llama_lm", dims)
    short, long = _prefill_peak(model, SHORT), _prefill_peak(model, LONG)
    assert long <= 4.5 * short, f"peak {short / 2**20:.1f} MiB at {SHORT} tokens, {long / 2**20:.1f} MiB at {LONG}"
    scores = dims["num_attention_heads"] * LONG * LONG * 4        # one fp32 score matrix of the long prompt
    assert long < scores / 8
