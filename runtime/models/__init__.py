"""One folder per model family: everything mstar knows about one family's runtime.

    decoder_lm/   llama_lm, qwen2_lm, qwen3_lm, qwen3_moe_lm and the decoder-LM executor
    bagel/        BAGEL's MoT LM, SigLIP ViT, FLUX VAE, CFG combine (+ its Triton kernel), image I/O
    qwen3_omni/   Qwen3-Omni's encoders, talker, code predictor, code2wav, speech prompt, executors
    orpheus/      the SNAC decoder, Orpheus' audio-token mapping, windows and executors
    vjepa2/       the V-JEPA 2 encoder, the AC predictor, per-frame KV rollouts and planning
    whisper/      Whisper's encoder, its decoder (cross-attention memory in the paged KV), the transcription routes
    pi05/         π0.5's PaliGemma prefix, its action expert run a step at a time, /v1/actions
    zimage/       Z-Image's text encoder, its DiT run a step at a time, its image drawer

A family folder is named after the module that declares the family (`mstar_compiler/catalogue/<family>.py`,
which stays torch-free): its `FAMILY` names the family's kinds, the class implementing each kind (in
`<family>/<kind>.py`, a class attribute `kind` naming it), its executor factories (in `<family>/executors.py`)
and its serving hooks (`<family>/serving.py`), all by "module:attr" name. The generic runtime
(conductor, worker, server core) names no family and no kind: it reads the plan, whose
nodes carry their kind and the name of their executor, and finds their code through the families.
"""
