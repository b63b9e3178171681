"""Qwen3-Omni's speech side: shared pieces of the five `qwen3_omni_*` kinds, and how they run.

Modules: `talker_prompt` (the talker's prefill rows and per-step text rows), `speech`
(one batched talker step with its code predictor loop; a reference driver), `talker_layers`
(M-RoPE, shared-expert MoE, talker decoder layer), `codec_layers` (code2wav's causal convs),
`mel` (log-mel front end), `vision_grid` (patches and their positions), `rope`, `weights`
(slots, initialisation; which checkpoint tensors are whose is the graph's mapping). The thinker
is the shared `qwen3_moe_lm`.

How the runtime drives speech for a batch (three tracks per request, joined by streams)
-------------------------------------------------------------------------------------
Thinker track (qwen3_moe_lm; encoders first when the prompt has audio or images):
    audio_encoder.encode(waveforms: list[(S,)]) -> list[(T_i, thinker_hidden)]
    vision_encoder(images: list[(3, H, W)]) -> list[(hidden (T_i, thinker_hidden), deepstack (D, T_i, thinker_hidden))]
    thinker(input_ids, positions, batch, cache, embeds=..., embeds_rows=...) -> hidden; sample a token
  Every token the thinker feeds itself is streamed to the talker as its input embedding
  (`thinker_hidden`, fixed(1)); the prompt's layer-`accept_hidden_layer` states at
  audio/image/video positions go along once (`thinker_mm_hidden`). The final stop token
  is never fed, so never streamed; the thinker's end finishes the stream.

Talker track (qwen3_omni_talker + qwen3_omni_code_predictor, one rank):
    once the thinker has sampled its first token:
      rows = talker_prompt(talker, prompt_ids (T,), thinker_embeds (T+1, Dt),
                           thinker_mm_hidden (T, Dt) | None, tts_embeds (3, Dt), speaker)  # (P, H)
      text = TalkerText(talker, tts_embeds); later: text.push(embeds (n, Dt)), text.finish()
    every conductor iteration, for the requests whose prefill chunk is scheduled or whose
    `text.is_ready()` (a decode step needs one text row; otherwise it waits for the thinker):
      rows_i = prompt chunk, or  frame_embed_i + text_i.next_row()             # (n_i, H)
      step = speak_step(talker, predictor, cat(rows_i), positions, batch, cache,
                        sample, sample_residual)                               # SpeechStep
        talker forward on the paged cache -> codebook-0 logits over `talker.speakable()`
        -> code0 -> predictor.predict_frames(stack(hidden, embed_codes(code0)), code0)
        -> frames (B, G) and frame_embed (B, H) (its own per-frame paged cache, one block
        of G rows per request, each inner step runs only the new row)
      step.is_eos[i]: request i has finished speaking -> finish its code2wav stream
      else: push step.frames[i] to the code2wav stream; keep step.frame_embed[i]
    Positions: 0..P-1 then +1 per step for text prompts (3-D M-RoPE rows for multimodal
    prompts come from the thinker's rope index). `speak_step` and `generate_frames`
    (tests/runtime/models/qwen3_omni/speech_reference.py) are this loop for requests whose
    text is complete (tests compare it with transformers' generate).

Code2wav track (qwen3_omni_code2wav), per stream release of LeftContext(chunk 25, context 25):
    audio = code2wav.decode_chunks([chunk.items (F_i, G)], [chunk.num_context])   # new samples (S_i,)
  Requests with released chunks decode in one right-padded batch; the concatenated
  chunks of a request equal its unchunked decode where the receptive field fits in the
  context (exact for the tiny preset), with no samples lost between chunks.

Every step above is batch-invariant: a request's frames and audio do not depend on what
else shares its batches (tests/runtime/qwen3_omni/).
"""
