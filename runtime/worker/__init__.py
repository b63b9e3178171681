"""A worker: one process per rank. Loads its nodes, owns their KV caches, runs batches.

  loader.py  builds the rank's node modules (weights shared between `same_as` nodes)
  worker.py  the process's loop: control messages in, batches run, results and tensors out
  streams.py the per-request buffers of the streaming edges this rank consumes; pushing items out
"""
