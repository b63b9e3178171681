"""The HTTP server: OpenAI-compatible endpoints, native task endpoints, the page, /metrics, /health.

Imports point one way: app.py (the composition root) builds the server and installs the handlers;
the handlers see the server only through context.py's `ServerContext`, never app.py.

  app.py          `MstarServer`: the aiohttp application, its life cycle (start/drain), the simple routes
  context.py      `ServerConfig` and `ServerContext`: what every handler may use of the server
  schemas.py      the request bodies, one msgspec Struct per endpoint, parsed once (`read_body`)
  families.py     what a model family adds (its routes, speaker, chat inputs, realtime listener)
  errors.py       OpenAI's error body and the middleware that guarantees it
  sse.py          Server-Sent Events: the response, one event's framing, the error event, [DONE]
  params.py, limits.py, logprobs.py   a request's params and bounds, checked before admission
  chat.py         /v1/chat/completions (text, images, a family's media parts; SSE events)
  audio_routes.py the audio endpoints: audio_chat.py (chat answered in speech), speech.py
                  (/v1/audio/speech), realtime.py (/v1/realtime, realtime_session.py, realtime_utterance.py)
  transcriptions.py  /v1/audio/transcriptions, /v1/audio/translations (a family's `Transcriber`, else the chat LM)
  images.py       /v1/images/generations and /v1/images/edits (a family's `Drawer`)
  tasks.py        /v1/tasks/{task}: any task of the plan with its declared params
  state_feed.py, page.py   /v1/state (and its SSE feed), the page and /v1/graph
  metrics.py, audio_metrics.py, prefix_metrics.py   Prometheus metrics
"""
