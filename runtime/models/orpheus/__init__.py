"""Orpheus TTS, audio side: token ids -> SNAC codes -> streamed 24 kHz audio.

The graph (graphs/orpheus.yaml) runs two tracks joined by a streaming edge:

  lm (llama_lm, orpheus-3b) --token--> [sliding: window 28, stride 7] --> snac.codes

How the runtime drives the SNAC windows per stream chunk:
  1. The LM's decode loop pushes every sampled token id of a request into that request's
     `StreamBuffer(Sliding(28, 7))` (runtime/streams/chunk_policy.py).
  2. Whenever buffers release chunks (first at 28 tokens = 4 frames, then every 7 = one
     frame; at the end one final flush chunk), the worker calls
     `SnacDecoder.decode_chunks(tokens, starts, num_context, is_final)` once with the
     chunks of all requests that have one (`Chunk.items`, `.start`, `.num_context`,
     `.is_final`).
  3. Each chunk decodes as one window of whole frames (4 in steady state, so all
     requests' windows batch together with static shapes); `windows.emitted_frames`
     says which of its frames are new audio: the window's 2nd frame in steady state
     (Orpheus's samples [2048:4096]), plus frame 0 on the first window and the two
     lagged tail frames on the final chunk (`keep_edges`, default on).
  4. The returned samples go to the client in order; concatenated they cover every
     complete frame exactly once.
Tokens that are not audio tokens of their frame position (e.g. a stray text token)
make their window decode to silence, as Orpheus drops such windows. A final chunk that
carries no tokens (the producer ended right after a non-final release) emits nothing, so
the two lagged tail frames of such an utterance are lost (Orpheus loses them always).
"""
from __future__ import annotations

from runtime.models.orpheus.codes import TOKENS_PER_FRAME, codes_to_tokens, tokens_to_codes
from runtime.models.orpheus.windows import FrameSpan, emitted_frames

__all__ = ["TOKENS_PER_FRAME", "FrameSpan", "codes_to_tokens", "emitted_frames", "tokens_to_codes"]
