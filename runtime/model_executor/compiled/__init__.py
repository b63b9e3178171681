"""CUDA-graph capture of a plan's capture regions per batch bucket.

* `capture_buckets(plan, node, rank)` / `bucket_for(n, buckets)` — which buckets a node
  has and which one a batch of n requests runs in;
* `DecodeInputs` — static device buffers of a decode step and the padding of a batch
  into them (padding rows write only the KV cache's padding slot);
* `DecodeGraphs` — a decoder LM's decode step per bucket: CUDA graphs on CUDA, inductor-
  compiled C++ on CPU when the node asks (`cpu_compile`, see cpu_compile.py), the same
  padded step eagerly otherwise.
"""
from __future__ import annotations

from runtime.model_executor.compiled.buckets import bucket_for, capture_buckets
from runtime.model_executor.compiled.decode_graphs import DecodeGraphs
from runtime.model_executor.compiled.decode_inputs import DecodeInputs

__all__ = ["DecodeGraphs", "DecodeInputs", "bucket_for", "capture_buckets"]
