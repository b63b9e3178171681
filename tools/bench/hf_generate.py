"""HF transformers `generate` with static batching: the plain-library baseline of `chat`.

All jobs go in one left-padded batch; generation runs greedily to the longest forced
length (EOS is ignored by forcing `min_new_tokens`), so every request returns when the
batch ends and the tokens past a request's own length are wasted work. Useful tokens
are the forced lengths.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from bench.openai_load import BurstResult, ChatJob


class HFGenerate:
    """SmolLM2 (the fp32 safetensors export) under transformers, in this process."""

    def __init__(self, model_dir: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def _encode(self, jobs: Sequence[ChatJob]):
        texts = [self.tokenizer.apply_chat_template(j.messages(), tokenize=False,
                                                    add_generation_prompt=True) for j in jobs]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def burst(self, jobs: Sequence[ChatJob]) -> BurstResult:
        """One static batch of all jobs; every request's E2E is the batch's wall time."""
        longest = max(j.max_tokens for j in jobs)
        start = time.perf_counter()
        batch = self._encode(jobs)
        with self.torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        wall = time.perf_counter() - start
        generated = out.shape[1] - batch["input_ids"].shape[1]
        if generated != longest:
            raise RuntimeError(f"HF generate made {generated} tokens, {longest} were forced")
        return BurstResult([wall] * len(jobs), [j.max_tokens for j in jobs], wall)
