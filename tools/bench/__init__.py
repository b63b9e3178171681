"""mstar's benchmark suite: `python tools/bench.py [suite...]` or `make bench`.

Package layout, one concern per module:
  registry     suite registry, the `Needs` error and the run context
  abab         A/B alternation of the compared sides in ABBA order, rounds and warm-up
  stats        medians, min/max, percentiles, per-round ratios, verdicts in words
  results      the result JSON schema (one file per suite run) and machine facts
  report       the markdown table; plots: the PNG figures
  cache_state  the cold / warm cache modes and the rule that a row's sides ran in the same one
  peers        a served side (label, cache counters, settings as it reports them); peer_mstar, peer_vllm,
               peer_llamacpp start each kind (llamacpp_serve: the xllamacpp launcher); chat_prompts: the
               chat suite's nonce prompts round after round
  servers      start/stop a model server process; openai_load: the chat load generator (bursts,
               closed and open loops; a command line); speech_load: the speech one (streamed bursts,
               the listeners' underruns; a command line); image_load: concurrent image requests
  playback     the simulated real-time listener: underruns from chunk arrival times
  tts_graphs   the graph copies the served speech comparisons compile; tts_served: those comparisons
  hf_generate  the HF transformers static-batch baseline; smollm2_fp32: the GGUF -> fp32 export
  suite_*      one module per comparison (chat, rollout, cfg, tts, stack, sched, linear, speech)
Everything here is a tool, not part of the served runtime.
"""
