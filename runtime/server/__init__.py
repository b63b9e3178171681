"""The HTTP server: OpenAI-compatible endpoints, native task endpoints, /metrics, /health.

  app.py      the aiohttp application, its life cycle (start/drain) and the simple routes
  chat.py     /v1/chat/completions (text; streaming over SSE; usage and finish_reason)
  tasks.py    /v1/tasks/{task}: any task of the plan with its declared params
  errors.py   OpenAI's error body and the middleware that guarantees it
  metrics.py  Prometheus metrics
  text.py     tokenizer of the served LM and incremental detokenisation
  streaming.py   wires in the streaming endpoints below and their metrics (stream_metrics.py)
  speech.py      /v1/audio/speech (Orpheus, Qwen3-Omni), audio streamed as decoded (audio_io.py,
                 speech_model.py: prompts, voices, playback measurement)
  audio_chat.py  /v1/chat/completions with modalities ["text", "audio"] (Qwen3-Omni)
  rollouts.py    /v1/rollouts (V-JEPA 2-AC world-model rollouts, optionally one frame per SSE event)
"""
