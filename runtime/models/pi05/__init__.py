"""π0.5 (graphs/pi05.yaml): `pi05_prefix` (PaliGemma over the cameras and the prompt: the prefix's keys and values),
`pi05_expert` (the action expert, one flow step), `gemma` (the Gemma pieces both use), `executors` (the prefix over
a batch; the expert as one Euler step of each request of a batch, whatever step each is at), `actions_api`
and `serving` (POST /v1/actions)."""
