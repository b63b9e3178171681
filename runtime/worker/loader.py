"""Builds the modules of one rank's nodes, once per weight group.

Nodes with the same `weight_key` (`same_as` in YAML) on one rank share one module; each
still gets its own executor, hence its own KV cache. Where a node's weights come from is
`runtime.model_executor.weights.sources.resolve`: a published repository through the graph's mapping
(`--weights ROOT`, ROOT/<repository name>), a path, or seeded random weights when the preset
or `--random-weights` asks for them — never silently; the source is reported back per node.

Tensor parallelism: the nodes of a rank with `placement.tp_size > 1` are built with
`tp=group`, the `TensorParallelGroup` this rank forms with the other ranks of the node's
rank set (`tensor_parallel_group`); every rank reads the full tensors and keeps its shard.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from mstar_compiler.plan import Node, Plan
from runtime.model_executor.components import component_class
from runtime.model_executor.heap import TRIM_AFTER, release_freed_memory
from runtime.model_executor.parallel import SINGLE, TensorParallelGroup, init_tensor_parallel, pack_linears
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.layers import DecoderLM
from runtime.model_executor.parallel.cpu_linear import bf16_gemm_note
from runtime.model_executor.parallel.quant import quantized_weights
from runtime.model_executor.weights.published import WeightMismatch, check_published, load_published
from runtime.model_executor.weights.slots import Slot, checkpoint_follows, module_slots
from runtime.model_executor.weights.sources import NodeWeights, WeightOptions, resolve
from runtime.text import ByteTokenizer, TextTokenizer, load_text_tokenizer
from runtime import progress
from runtime.model_executor.parallel.cpu_linear import device_of

log = logging.getLogger(__name__)

def weight_source(plan: Plan, node: Node, options: WeightOptions | None = None) -> str | None:
    """Checkpoint directory or reference for `node` (a repository dir, path or gguf:<package>), None
    for random weights or none; raises MissingWeights when a node that needs weights has none."""
    return resolve(plan, node, options or WeightOptions()).path


def node_tokenizer(plan: Plan, name: str, options: WeightOptions) -> TextTokenizer | ByteTokenizer:
    """The tokenizer of node `name`'s checkpoint (the one the server reads its prompts with), or the byte
    tokenizer of random weights: what its requests' grammars are matched on."""
    return load_text_tokenizer(resolve(plan, plan.node(name), options).path)


def describe_source(plan: Plan, node: Node, options: WeightOptions | None = None) -> str:
    """What `/v1/models` says about a node's weights."""
    return resolve(plan, node, options or WeightOptions()).describe()


def _is_gguf(ref: str) -> bool:
    return ref.startswith("gguf:") or ref.endswith(".gguf") or (
        os.path.isdir(ref) and any(Path(ref).glob("*.gguf")))


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_module(node: Node, ref: str | None, tp: TensorParallelGroup = SINGLE) -> torch.nn.Module:
    """The node's module with weights from `ref` (or its seed), cast to the node's dtype (its KV
    cache follows); this rank's shard under `tp`."""
    cls = component_class(node.kind)
    args: dict[str, Any] = dict(node.args)
    if ref is not None and _is_gguf(ref):
        # a quantized node reads the GGUF itself: its Q4 blocks become its int4 codes as they are
        from runtime.model_executor.weights.gguf_loader import resolve_gguf
        ref = str(resolve_gguf(ref)) if node.quant else gguf_as_safetensors(ref)
    dtype = TORCH_DTYPES[node.dtype]
    with cast_as_built(dtype, node.quant):
        if tp.size > 1:
            module = cls(node.dims, {**args, "weights": ref}, tp=tp)
        else:
            module = cls(node.dims, {**args, "weights": ref})
    return module.to(dtype).eval()


@contextlib.contextmanager
def cast_as_built(dtype: torch.dtype, quant: str = "") -> Iterator[None]:
    """Within: each module is cast to `dtype` as it is attached to its parent, so a bf16 model is never
    whole in fp32 (a 3B model would need its 13 GB fp32 copy to start). The values are the ones a cast of
    the whole model gives: every module is initialised (in fp32, as built) before it is attached. With
    `quant`, each linear that quantizes is told to as it is attached, before its dense weight is ever
    filled (runtime.model_executor.parallel.quant)."""
    def attached(parent: torch.nn.Module, name: str, child: torch.nn.Module | None) -> None:
        if child is None:
            return
        if quant and callable(getattr(child, "quant_as_loaded", None)):
            child.quant_as_loaded(quant)
        built = sum(p.nbytes for p in child.parameters(recurse=False) if p.dtype != dtype and p.device.type != "meta")
        child.to(dtype)
        if built >= TRIM_AFTER:      # its fp32 weights are freed: their pages go back before the next part
            release_freed_memory()
    handle = torch.nn.modules.module.register_module_module_registration_hook(attached)
    try:
        yield
    finally:
        handle.remove()


def meta_slots(node: Node) -> dict[str, Slot]:
    """The node's checkpoint slots, its module built on the meta device (no memory, no data, and no
    random draws: drawing them on meta costs ~4 minutes for Qwen3-Omni's 28,000 tensors)."""
    with torch.device("meta"), checkpoint_follows():
        return module_slots(build_module(node, None))


def check_plan_sources(plan: Plan, sources: Mapping[str, NodeWeights]) -> None:
    """Raise for the first mapped weight group whose repository does not match (headers only, the
    modules built on the meta device, as the worker builds them): a worker that cannot load would otherwise
    die and be restarted."""
    for node in plan.nodes:
        source = sources[node.name]
        if node.weight_key != node.name or source.kind != "mapped" or source.path is None:
            continue
        report = check_published(node, Path(source.path), meta_slots(node))
        if not report.is_ok:
            raise WeightMismatch(node, Path(source.path), report)
        for note in report.config_notes:
            log.warning("node '%s': %s", node.name, note)


def tensor_parallel_group(plan: Plan, rank: int, init_method: str) -> TensorParallelGroup:
    """Join the tensor-parallel group of `rank` (gloo on CPU, NCCL on CUDA); SINGLE when it has none."""
    ranks = plan.tp_ranks(rank)
    if ranks is None:
        return SINGLE
    if torch.cuda.is_available():
        torch.cuda.set_device(rank_device(rank))
    log.info("rank %d: joining tensor-parallel group %s at %s", rank, ranks, init_method)
    return init_tensor_parallel(ranks.index(rank), len(ranks), init_method)


def gguf_as_safetensors(ref: str) -> str:
    """A safetensors copy of a GGUF's de-quantised HF state dict, written once and reused.

    De-quantising costs seconds on every start and components read safetensors; the copy
    lives in $MSTAR_CACHE (default ~/.cache/mstar) keyed by the GGUF's path, size and mtime.
    """
    from safetensors.torch import save_file

    from runtime.model_executor.weights.gguf_loader import gguf_cache_path, open_gguf, resolve_gguf
    target = gguf_cache_path(resolve_gguf(ref), ".safetensors")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        save_file({k: v.contiguous() for k, v in open_gguf(ref).state_dict().items()}, str(tmp))
        tmp.rename(target)
    return str(target)


def rank_device(rank: int) -> torch.device:
    """The device a rank's modules live on: its own CUDA device when there are any, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def load_rank(plan: Plan, rank: int, options: WeightOptions | None = None,
              tp: TensorParallelGroup = SINGLE, pack: bool = True) -> dict[str, tuple[torch.nn.Module, str]]:
    """node name -> (module, weight source) for every node of `rank`, on the rank's device
    (`tp`: the rank's tensor-parallel group, used by its nodes with tp_size > 1). Its linears are packed for
    the CPU, each packed copy the weight's only one (`pack=False` keeps the dense weights: a test's oracle
    reads them)."""
    torch.manual_seed(0)
    options = options or WeightOptions()
    device = rank_device(rank)
    by_key: dict[str, torch.nn.Module] = {}
    out: dict[str, tuple[torch.nn.Module, str]] = {}
    for name in plan.ranks[rank].nodes:
        node = plan.node(name)
        source = resolve(plan, node, options)
        if node.weight_key not in by_key:
            log.log(logging.WARNING if source.kind == "random" else logging.INFO,
                    "rank %d: loading %s (%s) from %s", rank, name, node.kind, source.describe())
            group = tp if node.placement.tp_size > 1 else SINGLE
            if node.quant and device.type != "cpu":
                raise RuntimeError(f"node '{name}' is declared quant: {node.quant}, which runs on CPU ranks only "
                                   f"(rank {rank} is {device})")
            if source.kind == "random":     # a module that draws its own initial values draws the same ones
                torch.manual_seed(source.seed)  # whatever the rank loaded before it (a plan that includes it)
            module = load_node(plan.node(node.weight_key), source, group)
            by_key[node.weight_key] = module = module if device.type == "cpu" else module.to(device)
            release_freed_memory()          # the build's fp32 parts and draws, before packing adds its copies
            if pack:
                packed = pack_linears(module)
                log.debug("rank %d: %s: %d linear weights packed", rank, name, packed)
            release_freed_memory()
            if device.type == "cpu" and (note := bf16_gemm_note()) and _has_bf16_weights(module):
                log.warning("rank %d: %s: %s", rank, name, note)
            if node.quant:
                log.log(logging.WARNING if node.dtype == "fp32" else logging.INFO, "rank %d: %s: %s", rank, name,
                        quant_note(module, node.quant, node.dtype))
            if (kernels := cpu_kernels_note(module)) and kernels != "fused":
                log.warning("rank %d: %s: fused CPU kernels %s; its layers run torch ops (slower)", rank, name, kernels)
            progress.advance(f"loaded {name}")
        out[name] = (by_key[node.weight_key], source.describe())
    return out


def quant_note(module: torch.nn.Module, scheme: str, dtype: str) -> str:
    """What the log says of a quantized node: how many weights, how many kept as a file stored them, and for fp32
    activations that torch's quantized kernels run them on a generic path (docs/quantization.md)."""
    weights = quantized_weights(module)
    kept = sorted({w.exact for w in weights if w.exact})
    note = f"{len(weights)} weights {scheme}" + (f", {sum(bool(w.exact) for w in weights)} with the codes of "
                                                 f"{' and '.join(kept)} as stored" if kept else ", quantized at load")
    if dtype == "fp32":
        note += ("; fp32 activations: torch's int8/int4 kernels run them on a generic path, many times slower than "
                 "bf16 (docs/quantization.md): serve the node in bf16 for speed")
    return note


def cpu_kernels_note(module: torch.nn.Module) -> str:
    """For a decoder LM on CPU: "fused", or why its layers run torch ops (runtime/model_executor/kernels/cpu.py); else ""."""
    on_cpu = any(True for _ in module.parameters()) and device_of(module).type == "cpu"
    return cpu_kernels.describe() if on_cpu and isinstance(module, DecoderLM) else ""


def _has_bf16_weights(module: torch.nn.Module) -> bool:
    return any(p.dtype == torch.bfloat16 and p.dim() == 2 for p in module.parameters())


def load_node(node: Node, source: NodeWeights, tp: TensorParallelGroup = SINGLE) -> torch.nn.Module:
    """The node's module with its weights from `source` (a published repository through the plan's mapping)."""
    if source.kind != "mapped":
        return build_module(node, source.path if source.kind == "path" else None, tp)
    assert source.path is not None
    with checkpoint_follows():
        module = build_module(node, None, tp)
    load_published(module, node, Path(source.path))
    return module
