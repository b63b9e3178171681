"""Attention backends behind one interface (`AttentionBackend`) and the switch between them.

`select_backend(device, name)`: "torch" (reference, any device), "cpu" (decode rows and
prefill chunks through the fused paged kernels of runtime/model_executor/kernels/cpu.py), "triton" (paged
kernels; CPU only under TRITON_INTERPRET=1), "flashinfer" (CUDA), or "auto": flashinfer
on CUDA when it imports, else triton on CUDA; on CPU "cpu" where its kernels are built, else
torch (`runtime.model_executor.kernels.cpu.status()` says why not).
"""
from __future__ import annotations

import importlib.util

import torch

from runtime.model_executor.attention.backend import AttentionBackend, AttentionShape
from runtime.model_executor.attention.metadata import AttentionMetadata
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.attention.cpu_backend import CpuAttention
from runtime.model_executor.attention.torch_backend import TorchAttention
from runtime.model_executor.attention.triton_backend import TritonAttention

BACKENDS = ("torch", "cpu", "triton", "flashinfer")


def select_backend(device: torch.device | str, name: str = "auto") -> AttentionBackend:
    """A fresh attention backend for `device` (each model instance holds its own)."""
    device = torch.device(device)
    if name == "auto":
        if device.type != "cuda":
            name = "cpu" if device.type == "cpu" and cpu_kernels.status() == "" else "torch"
        else:
            name = "flashinfer" if importlib.util.find_spec("flashinfer") else "triton"
    if name == "torch":
        return TorchAttention()
    if name == "cpu":
        if device.type != "cpu" or cpu_kernels.status():
            raise ValueError(f"the cpu attention backend needs a CPU device and its kernels "
                             f"({cpu_kernels.status() or 'device ' + device.type})")
        return CpuAttention()
    if name == "triton":
        return TritonAttention()
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend needs a CUDA device")
        from runtime.model_executor.attention.flashinfer_backend import FlashInferAttention

        return FlashInferAttention(device)
    raise ValueError(f"unknown attention backend {name!r}; choose one of {BACKENDS} or 'auto'")


__all__ = ["AttentionBackend", "AttentionMetadata", "AttentionShape", "BACKENDS", "select_backend"]
