"""The HTTP server: OpenAI-compatible endpoints, native task endpoints, /metrics, /health.

  app.py      the aiohttp application, its life cycle (start/drain) and the simple routes
  chat.py     /v1/chat/completions (text; streaming over SSE; usage and finish_reason)
  tasks.py    /v1/tasks/{task}: any task of the plan with its declared params
  errors.py   OpenAI's error body and the middleware that guarantees it
  metrics.py  Prometheus metrics
  text.py     tokenizer of the served LM and incremental detokenisation
"""
