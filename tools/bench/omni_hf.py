"""transformers' Qwen3-Omni as its README runs it, in a process of its own: the `omni-wide` suite's peer.

    python tools/bench/omni_hf.py REPO [--threads N]

Loads `Qwen3OmniMoeForConditionalGeneration.from_pretrained(REPO)` in bf16 with sdpa attention (the
README's flash-attention 2 needs a GPU), prints one JSON line `{"ready": seconds}`, then answers one JSON
line per burst read from stdin until EOF:

  {"prompts": [[ids], ...], "tokens": N}                 text: `generate(return_audio=False)`
  {"prompts": [[ids], ...], "tokens": N, "frames": F}    text + speech: `generate(return_audio=True)`

Every prompt of a burst goes into one batch (transformers batches statically: a burst is one `generate`
call, every request returns when the batch ends), greedy, exactly N thinker tokens (min = max new tokens)
and, with speech, exactly F codec frames (talker min = max new tokens F + 1: the last talker token gets no
code predictor call), greedy talker without repetition penalty (mstar's talker is greedy). The answer:
`{"wall": s, "token_times": [s, ...], "tokens": [n, ...], "samples": [n, ...]}`: seconds from the call to
each decode step's tokens (a streamer's `put`; the first is the prompt), thinker tokens and audio samples
per request. transformers returns the audio when `generate` returns: that is its time to first audio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


class StepTimes:
    """A `generate` streamer that records when each step's tokens arrive (any batch size)."""

    def __init__(self, start: float) -> None:
        self.start, self.times = start, []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter() - self.start)

    def end(self) -> None:
        pass


def burst(model, spec: dict, speaker: str) -> dict:
    if len({len(p) for p in spec["prompts"]}) != 1:
        raise ValueError("the prompts of a burst must be of one length (no padding is sent)")
    ids = torch.tensor(spec["prompts"])
    n, frames = int(spec["tokens"]), spec.get("frames")
    start = time.perf_counter()
    steps = StepTimes(start)
    thinker = {"thinker_max_new_tokens": n, "thinker_min_new_tokens": n, "thinker_do_sample": False,
               "thinker_streamer": steps}
    with torch.inference_mode():
        if frames is None:
            out = model.generate(input_ids=ids, return_audio=False, **thinker)
            sequences, wavs = (out.sequences if hasattr(out, "sequences") else out), None
        else:
            sequences, wavs = model.generate(
                input_ids=ids, return_audio=True, speaker=speaker, **thinker,
                talker_max_new_tokens=int(frames) + 1, talker_min_new_tokens=int(frames) + 1,
                talker_do_sample=False, talker_repetition_penalty=1.0)
    wall = time.perf_counter() - start
    if wavs is not None and not isinstance(wavs, list):
        wavs = list(wavs.reshape(ids.shape[0], -1))
    return {"wall": wall, "token_times": steps.times,
            "tokens": [int(sequences.shape[1] - ids.shape[1])] * ids.shape[0],
            "samples": [int(w.numel()) for w in wavs] if wavs is not None else []}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--speaker", default="Ethan")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import Qwen3OmniMoeForConditionalGeneration

    start = time.perf_counter()
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(args.repo, dtype=torch.bfloat16,
                                                                 attn_implementation="sdpa").eval()
    # the talker reads thinker layer `accept_hidden_layer` (24) at audio, image and video placeholders; transformers
    # indexes it even where there is none (text prompts: the suite's), past the cut's 4 layers: clamp it
    talker, layers = model.config.talker_config, model.config.thinker_config.text_config.num_hidden_layers
    talker.accept_hidden_layer = min(talker.accept_hidden_layer, layers)
    print(json.dumps({"ready": time.perf_counter() - start, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(burst(model, json.loads(line), args.speaker)), flush=True)


if __name__ == "__main__":
    main()
