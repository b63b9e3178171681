"""The conductor: every request's task state, batching at node granularity, dispatch to workers.

  request.py    Request and its ordered state enum (transitions are methods)
  cursor.py     interprets one track of a task: walk programs, loops, transitions
  kv_ledger.py  the conductor's count of KV blocks per (rank, KV node): admit, grow, preempt
  scheduler.py  picks the next batches (one per (rank, node)) within KV capacity
  batch.py      what it forms: a batch of one node and its entries (one per request's Run)
  steady.py     decode rows kept from step to step (placed and applied without the general path)
  workers.py    starts, watches and restarts the local worker processes
  streams.py    streaming edges: per-request buffer mirrors, back-pressure, chunk takes, per_chunk tracks
  playback.py   audio requests' playback clocks; earliest-deadline-first order of running requests
  conductor.py  the loop: schedule, dispatch, apply results; the server's entry points
"""
