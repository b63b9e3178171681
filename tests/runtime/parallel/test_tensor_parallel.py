"""Tensor parallelism over two CPU processes (gloo) gives the logits of the unsharded model."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.runtime.models.decoder_lm.lm_factories import tiny_dims
from runtime.model_executor.parallel import SINGLE
from tests.runtime.parallel.tp_worker import TP_CASES, run_schedule
from tests.runtime.serving.conftest import free_port

WORKER = Path(__file__).with_name("tp_worker.py")


def test_tp2_logits_equal_tp1(tmp_path: Path) -> None:
    port = free_port()
    repo = str(WORKER.resolve().parents[3])    # tp_worker imports the decoder-LM test factories as tests.*
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), "2", str(port), str(tmp_path)],
                              env=env, cwd=WORKER.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in range(2)]
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out}"
    sharded = load_file(str(tmp_path / "logits.safetensors"))
    with torch.no_grad():
        for name, kind, extra in TP_CASES:
            whole = run_schedule(kind, tiny_dims(kind, **extra), SINGLE)
            assert sharded[name].shape == whole.shape
            # tensor parallelism sums each row-parallel projection's two halves after the fact (an all-reduce), in
            # another order than one GEMM: a few fp32 ulps (eps 1.2e-7) per layer on logits |l| <= 1.3; measured max
            # |diff| 2.1e-7, 1.6% of the bound
            torch.testing.assert_close(sharded[name], whole, atol=1e-5, rtol=1e-5, msg=name)


def test_heads_must_split_over_the_group() -> None:
    from runtime.model_executor.components import component_class
    from runtime.model_executor.parallel import TensorParallelGroup

    with pytest.raises(ValueError, match="num_key_value_heads = 2 does not split over tensor-parallel size 4"):
        component_class("llama_lm")(tiny_dims("llama_lm", num_attention_heads=8), {},
                                    tp=TensorParallelGroup(rank=0, size=4))
