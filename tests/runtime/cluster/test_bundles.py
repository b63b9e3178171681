"""What `--ray` asks the cluster for, from compiled tiny plans; and its errors, said before any actor starts.

The placement itself, on a real two-node Ray cluster, is tests/runtime/serving/cluster/test_ray.py.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import Plan, load_plan
from runtime.ranks.ray import ClusterError
from runtime.ranks.ray.bundles import PackGroup, pack_groups, rank_resources, tp_groups
from runtime.ranks.ray.ray_launcher import RayLauncher, RayOptions, reachable_endpoint
from runtime.ranks.workers import RankLaunch
from runtime.model_executor.weights.sources import WeightOptions
from tests.runtime.serving.conftest import REPO, free_port

HAS_RAY = importlib.util.find_spec("ray") is not None


def _plan(tmp_path: Path, graph: str, placement: str) -> tuple[Plan, str]:
    path = tmp_path / f"{graph}-{placement}.plan.bin"
    path.write_bytes(compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(preset="tiny", placement=placement)).data)
    return load_plan(str(path)), str(path)


def test_a_tensor_parallel_group_is_strictly_packed(tmp_path) -> None:
    plan, _ = _plan(tmp_path, "orpheus", "tp2")
    assert tp_groups(plan) == [(0, 1)]
    assert pack_groups(plan, "SPREAD") == [PackGroup((0, 1), "STRICT_PACK", True)], "SPREAD never splits a TP group"


def test_other_ranks_follow_the_strategy(tmp_path) -> None:
    plan, _ = _plan(tmp_path, "bagel", "cfg_parallel")
    assert pack_groups(plan, "SPREAD") == [PackGroup((0, 1, 2), "SPREAD", False)]
    disaggregated, _ = _plan(tmp_path, "orpheus", "disaggregated")   # two ranks, no TP: free to spread
    assert pack_groups(disaggregated) == [PackGroup((0, 1), "PACK", False)]
    with pytest.raises(ValueError, match="SPREAD_OUT.*none of PACK, SPREAD"):
        pack_groups(plan, "SPREAD_OUT")


def test_a_rank_asks_for_its_weights_memory_and_a_gpu_only_where_there_are_gpus(tmp_path) -> None:
    plan, _ = _plan(tmp_path, "bagel", "cfg_parallel")
    cpu = rank_resources(plan, 2, has_gpus=False)
    gpu = rank_resources(plan, 2, has_gpus=True)
    for rank, on_cpu, on_gpu in zip(plan.ranks, cpu, gpu):
        assert on_cpu.memory_bytes == rank.weight_bytes + rank.kv_bytes, "on a CPU the KV pools live in host memory"
        assert on_gpu.memory_bytes == rank.weight_bytes
        assert on_cpu.bundle() == {"CPU": 2, "memory": float(on_cpu.memory_bytes)}
        assert on_gpu.bundle()["GPU"] == 1.0
    assert gpu[0].memory_bytes > gpu[1].memory_bytes, "rank 0 holds the ViT and the VAE besides the LM"
    with pytest.raises(ValueError, match="positive"):
        rank_resources(plan, 0, has_gpus=False)


def test_an_actor_runs_the_worker_with_its_own_copies_and_its_node_address() -> None:
    launch = RankLaunch(2, "tcp://10.0.0.1:5555", "/srv/plan.bin", "/srv/keys/rank-2.json",
                        WeightOptions(("/w",), False), "info", 1)
    here = launch.argv()
    assert here[:4] == ["--conductor", "tcp://10.0.0.1:5555", "--rank", "2"]
    assert "/srv/keys/rank-2.json" in here and here[-1] == "/srv/plan.bin" and "--host" not in here
    there = launch.argv("/tmp/a/plan.bin", "/tmp/a/key.json", "10.0.0.7")
    assert there[-1] == "/tmp/a/plan.bin" and "/tmp/a/key.json" in there
    assert there[there.index("--host") + 1] == "10.0.0.7" and there[there.index("--weights") + 1] == "/w"


def test_a_loopback_conductor_endpoint_becomes_the_node_ip() -> None:
    assert reachable_endpoint("tcp://127.0.0.1:0", "10.1.2.3") == "tcp://10.1.2.3:0"
    assert reachable_endpoint("tcp://localhost:5555", "10.1.2.3") == "tcp://10.1.2.3:5555"
    assert reachable_endpoint("tcp://192.168.0.9:5555", "10.1.2.3") == "tcp://192.168.0.9:5555", "told: kept"


def test_without_ray_the_flag_says_what_to_install(tmp_path, monkeypatch) -> None:
    plan, path = _plan(tmp_path, "bagel", "cfg_parallel")
    monkeypatch.setitem(sys.modules, "ray", None)   # what `import ray` meets where Ray is not installed
    with pytest.raises(ClusterError, match=r"pip install 'mstar\[cluster\]'"):
        RayLauncher(RayOptions(), plan, path)


@pytest.mark.skipif(not HAS_RAY, reason="Ray is not installed: pip install 'mstar[cluster]'")
def test_a_head_that_does_not_answer_is_an_error_not_a_hang(tmp_path) -> None:
    _, path = _plan(tmp_path, "bagel", "cfg_parallel")
    address = f"127.0.0.1:{free_port()}"
    done = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", path, "--ray", address], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--ray {address}: no Ray head answers there" in done.stderr and "ray start --head" in done.stderr
