"""Orpheus TTS as a CPU user runs it beside a plain LM server: token ids streamed from the server, SNAC in the client.

The `orpheus-speech` package serves Orpheus with vLLM this way: the LM streams tokens; the client turns each
audio token into a SNAC code, and every 7 tokens from the 28th decodes the last 28 (4 frames) with the `snac`
package and plays samples [2048:4096] of the window (its second frame). This module does the same against a
served LM over HTTP, for two servers:

  vllm      POST /v1/completions, prompt as token ids, `return_token_ids` (each streamed chunk's new ids),
            `ignore_eos`
  llamacpp  POST /completion (llama-server's native endpoint), prompt as token ids, `return_tokens`,
            `ignore_eos`, `cache_prompt` false, top-k and min-p off (its defaults are 40 and 0.05)

Both sample with temperature and top-p only, as mstar does. Each stream reads its tokens in one task and decodes
its windows in order in a worker thread (torch releases the GIL), so reading never waits for SNAC; a window's
arrival is when its audio is decoded. A token that is an audio token of its frame slot maps to its code as the
model's vocabulary says (id - 128266 - 4096 * (index mod 7)); any other token (random weights sample the whole
vocabulary) is folded to `id mod 4096` and counted, so every 7 tokens make a frame and the client does the
decode work a trained model's stream gives it. The result is bench.speech_load's `StreamResult`.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp

from bench.speech_load import SpeechBurst, StreamResult, concurrent_streams

TOKENS_PER_FRAME, WINDOW, KEEP = 7, 28, slice(2048, 4096)
AUDIO_OFFSET, CODEBOOK = 128266, 4096
SERVERS = ("vllm", "llamacpp")


def to_code(token: int, index: int) -> tuple[int, bool]:
    """The SNAC code of the `index`-th generated token, and whether it had to be folded (not an audio token of
    its slot)."""
    code = token - AUDIO_OFFSET - CODEBOOK * (index % TOKENS_PER_FRAME)
    return (code, False) if 0 <= code < CODEBOOK else (token % CODEBOOK, True)


def window_levels(codes: Sequence[int]) -> list[list[int]]:
    """SNAC's three code levels of whole frames: per frame of 7 codes c0..c6, level 0 takes c0, level 1 c1 and c4,
    level 2 c2, c3, c5 and c6 (the coarse code, then its two and four finer steps in time order)."""
    if len(codes) % TOKENS_PER_FRAME:
        raise ValueError(f"{len(codes)} codes are not whole frames of {TOKENS_PER_FRAME}")
    levels: list[list[int]] = [[], [], []]
    for f in range(0, len(codes), TOKENS_PER_FRAME):
        c = codes[f:f + TOKENS_PER_FRAME]
        levels[0].append(c[0])
        levels[1] += [c[1], c[4]]
        levels[2] += [c[2], c[3], c[5], c[6]]
    return levels


class SnacClient:
    """The `snac` package's SNAC 24 kHz on the client, loaded from the suite's converted weights."""

    def __init__(self, snac_dir: Path) -> None:
        import torch
        from safetensors.torch import load_file
        from snac import SNAC

        self.torch = torch
        self.model = SNAC(**json.loads((snac_dir / "config.json").read_text())).eval()
        self.model.load_state_dict(load_file(str(snac_dir / "pytorch_model.safetensors")))

    def window_audio(self, codes: Sequence[int]) -> int:
        """Decode one 28-code window and return how many samples are kept (its second frame)."""
        torch = self.torch
        with torch.inference_mode():
            audio = self.model.decode([torch.tensor([level]) for level in window_levels(codes)])
        return int(audio[0, 0, KEEP].numel())


@dataclass
class _Stream:
    """One request's tokens as they arrive, and its decoded windows."""

    snac: SnacClient
    start: float
    codes: list[int] = field(default_factory=list)
    folded: int = 0
    arrivals: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    pending: list[asyncio.Future] = field(default_factory=list)

    def take(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            code, was_folded = to_code(int(token), len(self.codes))
            self.codes.append(code)
            self.folded += was_folded
            n = len(self.codes)
            if n >= WINDOW and n % TOKENS_PER_FRAME == 0:
                before = self.pending[-1] if self.pending else None
                self.pending.append(asyncio.ensure_future(self._decode(self.codes[-WINDOW:], before)))

    async def _decode(self, window: list[int], before: asyncio.Future | None) -> None:
        if before is not None:                     # windows of one stream are decoded and played in order
            await before
        kept = await asyncio.to_thread(self.snac.window_audio, window)
        self.arrivals.append(time.perf_counter() - self.start)
        self.samples.append(kept)


def request(server: str, prompt: list[int], max_tokens: int, model: str, seed: int, sampling: dict[str, float]) \
        -> tuple[str, dict[str, Any]]:
    """The path and body of one streamed request to `server`."""
    if server == "vllm":
        return "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                                   "ignore_eos": True, "return_token_ids": True, "seed": seed, **sampling}
    if server == "llamacpp":
        return "/completion", {"prompt": prompt, "n_predict": max_tokens, "stream": True, "ignore_eos": True,
                               "return_tokens": True, "cache_prompt": False, "seed": seed, "top_k": 0,
                               "min_p": 0.0, **sampling}
    raise ValueError(f"unknown server {server!r}: one of {SERVERS}")


def chunk_tokens(server: str, event: dict[str, Any]) -> list[int]:
    """The new token ids of one streamed event."""
    if server == "vllm":
        return [t for choice in event.get("choices", ()) for t in (choice.get("token_ids") or ())]
    return list(event.get("tokens") or ())


async def _one(session: aiohttp.ClientSession, url: str, server: str, body: tuple[str, dict[str, Any]],
               snac: SnacClient) -> tuple[StreamResult, int]:
    path, payload = body
    stream = _Stream(snac, time.perf_counter())
    async with session.post(url + path, json=payload) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}{path}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{url}{path} streamed an error: {str(event)[:300]}")
            stream.take(chunk_tokens(server, event))
    await asyncio.gather(*stream.pending)
    if not stream.arrivals:
        raise RuntimeError(f"{url}{path}: {len(stream.codes)} tokens, fewer than one window of {WINDOW}")
    return StreamResult(tuple(stream.arrivals), tuple(stream.samples), len(stream.codes)), stream.folded


def client_burst(url: str, server: str, bodies: Sequence[tuple[str, dict[str, Any]]], snac: SnacClient) \
        -> tuple[SpeechBurst, int]:
    """Stream every body at once from `server` at `url`, decoding in this process; the burst and how many tokens
    were folded to codes (RuntimeError when a stream fails)."""
    done, wall = concurrent_streams(lambda session, body: _one(session, url, server, body, snac), bodies,
                                    f"{url} ({server})", timeout_s=3600.0)
    return SpeechBurst([r for r, _ in done], wall), sum(f for _, f in done)
