"""BAGEL-7B-MoT: the pieces its components share, and how the runtime drives them.

Modules: `flow` (timestep schedule), `patchify` (2 x 2 latent / 14 x 14 pixel packing,
grid position ids), `embeddings` (sin-cos tables, timestep embedder), `image_io`
(BAGEL's resize), `segments` (what one LM call runs),
`joint_attention` + `mot_layers` (the mixture-of-transformers decoder), `vae_blocks`
(FLUX VAE blocks), `weights` (seeding and name-for-name loading).

Components, one call per batch (lists are per request, in batch order)
------------------------------------------------------------------------
  siglip_vit(images: list[(3, H, W)])          -> list[(H/14 * W/14, llm_hidden)]
        H, W multiples of 14: resize_for(image, VIT_RESIZE) then pil_to_tensor.
  vae_encoder(images: list[(3, H, W)])         -> list[(16, H/8, W/8)]
        H, W multiples of 16: resize_for(image, VAE_RESIZE) then pil_to_tensor.
  vae_decoder(latents: list[(16, h, w)])       -> list[(3, 8h, 8w)]   -> model_executor.images.png_bytes
  bagel_mot_lm(segments: list[Segment], kv_cache: PagedKVCache) -> MoTOutput
        outputs[i]: DECODE -> (vocab,) fp32 logits (sampled by runtime.model_executor.sampling);
                    GEN -> (16, h, w) velocity; TEXT / VIT / VAE -> None (KV written).
        states[i]:  (context_len, rope) of segment i's KV sequence after the call.
  cfg_combine(requests: list[CfgRequest])      -> list[(16, h, w)] next latents

KV sequences
------------
Each request owns up to three KV sequences in the LM's paged cache (one pool for the
node and its `same_as` CFG nodes): "full" (every input), "cfg_text" (BAGEL's
text-dropped context) and "cfg_img" (its image-dropped context). The conductor owns each
sequence's block table (runtime/conductor/kv_ledger.py: one pool per rank, a table per
(request, node)) and counts and keys the rows of every Run before it goes out
(`row_keys`); the runtime keeps per sequence its copy of the table (context_len = its
rows) and a RoPE position (image blocks use one position for all their rows, so rope !=
context_len); it builds `Segment(kind, context_len, rope, block_table, ...)` for a Run
that computes, applies the Run's block copies first (`PagedKVCache.copy_blocks`), and
after the call stores `states[i]`'s rope. A call holds any mix of segments of different
sequences, at most one per sequence.

Contexts follow BAGEL's `interleave_inference`, input by input:
  text input:   TEXT on full and TEXT on cfg_img (cfg_text keeps its context: BAGEL
                copies full's into it before the text);
  image input:  VAE on full, then VIT on full (I2T: VIT only); cfg_text the same.
A branch whose context would equal another's (cfg_text = full before a text; cfg_img =
full for a first text) takes that branch's blocks (reference counted) and computes
nothing; only a partly filled last block is copied on the next append.

Tasks
-----
T2I  (prompt; params steps N, timestep_shift s, cfg_text_scale, cfg_img_scale,
     cfg_interval, image size H x W, multiples of 16, default 1024 x 1024)
     1. contexts as above: full = TEXT(prompt), cfg_text = empty (context 0, rope 0),
        cfg_img = the same text (BAGEL's T2I uses cfg_img_scale 1: skip cfg_img).
     2. x = seeded randn(16, H/8, W/8), fp32.
     3. for i in 0 .. N-2: t, t_next = flow.flow_step_times(N, s, i);
          one bagel_mot_lm call with GEN(latent=x, timestep=t) on full, cfg_text
          (and cfg_img); then x = cfg_combine([CfgRequest(x, v_full, v_text, v_img,
          t, t_next)]). Outside cfg_interval guidance is off: run GEN on full only and
          pass v_text = v_img = None (same result, a third of the work).
     4. image = vae_decoder([x]).
I2I  (image, prompt): image -> resize_for(VAE_RESIZE) -> vae_encoder and, the same
     resized image, -> resize_for(VIT_RESIZE) -> siglip_vit; contexts: full = VAE, VIT,
     TEXT; cfg_text = VAE, VIT (fork before the text); cfg_img = TEXT. Then steps 2-4
     of T2I with H x W = the VAE-resized input size and all three branches.
I2T  (image, question): siglip_vit; full = VIT, then TEXT(question); then DECODE
     (tokens=[bos_token_id]) and DECODE(sampled token) per step until eos_token_id or
     max_tokens. Chat (text only): TEXT then the same DECODE loop. Understanding
     needs only "full".
Batching: GEN segments of many requests and branches, at any steps, share one call;
DECODE segments of many requests share one call, which runs on the paged attention
backend (calls of only TEXT / DECODE segments do); cfg_combine groups its requests by
latent shape and runs one fused kernel per group.
"""
