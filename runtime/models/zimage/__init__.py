"""Z-Image-Turbo (graphs/zimage.yaml): `zimage_text_encoder` (a Qwen3 LM's next-to-last hidden states of the prompt),
`zimage_dit` (the single-stream DiT), `sampler` (the flow-matching schedule, noise and Euler step as diffusers'
pipeline and scheduler compute them), `executors` (the encoder over a batch of prompts; the denoiser as one
Euler step of each request of a batch, whatever step each is at), `serving` (its answer to /v1/images/generations).
The VAE is BAGEL's `vae_decoder`."""
