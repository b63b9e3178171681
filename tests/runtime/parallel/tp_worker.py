"""One rank of the tensor-parallel test: `python tp_worker.py RANK WORLD PORT OUT_DIR`.

Builds each test model sharded over WORLD gloo ranks, runs the shared mixed schedule and,
on rank 0, writes the logits to OUT_DIR/logits.safetensors.
"""
from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, tiny_dims
from runtime.model_executor.components import component_class
from runtime.model_executor.parallel import init_tensor_parallel

# (name, kind, dims overrides): a tied odd vocabulary exercises the padded vocab shard
TP_CASES = [
    ("llama", "llama_lm", {}),
    ("llama_tied_odd_vocab", "llama_lm", {"tie_word_embeddings": True, "vocab_size": 511}),
    ("qwen2", "qwen2_lm", {}),
    ("qwen3_moe", "qwen3_moe_lm", {}),
]
SCHEDULE = [
    [("a", list(range(1, 12))), ("b", [5, 6, 7])],
    [("b", [8]), ("a", [3]), ("c", list(range(20, 29)))],
    [("a", [4]), ("c", [9]), ("b", [10, 11, 12, 13])],
]


def run_schedule(kind: str, dims: dict, tp) -> torch.Tensor:
    model = component_class(kind)(dims, {"seed": 3, "attention_backend": "torch"}, tp=tp).eval()
    runner = PagedRunner(model, num_blocks=32, block_size=4)
    return torch.cat([torch.cat(runner.step(chunks)) for chunks in SCHEDULE])


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    tp = init_tensor_parallel(rank, world, f"tcp://127.0.0.1:{port}", backend="gloo")
    logits = {name: run_schedule(kind, tiny_dims(kind, **extra), tp) for name, kind, extra in TP_CASES}
    if rank == 0:
        save_file(logits, f"{out_dir}/logits.safetensors")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
