"""prefill: time to the first content token of 256 / 1,024 / 4,096-token prompts, mstar-run vs vLLM's
CPU build vs llama.cpp's server, alone and while 8 other streams decode; and the peak RSS of an 8,191-token
prompt (+ 1 generated token: the model's 8,192 positions).

Every side serves SmolLM2-135M-Instruct in fp32 from the same weights (the chat suite's setup; llama.cpp
its F32 GGUF with an F32 KV cache) with the same KV budget (mstar's plan pool: vLLM's
`--kv-cache-memory-bytes`, llama.cpp's unified KV of as many tokens, 9 slots); they run at once and
alternate per case in ABBA order. The rows are cold (bench.cache_state): prefix caching off on every side
and every prompt new from its first tokens (the nonce is its system message, prefill_load), and each
run's cache counters must say no prompt token was reused on any side, or the row is refused. mstar-run
runs with its default `--prefill-chunk` of 256 tokens: 256 rows keep a CPU forward's matrix multiplies
near full speed while one chunk costs only a few decode steps of this model, so the running streams keep
flowing (runtime/conductor/scheduler.py); a prompt alone on the server takes its default
`--prefill-chunk-alone` of 1,024 tokens (no stream to keep flowing; fewer forwards); vLLM and llama.cpp
run with their own defaults (vLLM: 2,048-token steps here; llama.cpp: `-b 2048 -ub 512`). Under load,
the row "longest decode gap" is the worst wait any of the 8 streams saw between two tokens while the long
prompt waited for its first one, and "content chunks the 8 streams received" what they got meanwhile (one
decode step's text each): the decoding the prompt's TTFT shared the machine with.

Peak RSS is the VmHWM of each server's largest process (mstar's worker, vLLM's engine core, llama.cpp's
server) before and after the 8,191-token prompt, read from /proc: a lifetime peak, so "after" includes
loading the weights and the KV cache each has touched.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Callable

from bench import cache_state, prefill_load
from bench.cache_state import COLD, CacheMismatch
from bench.peer_llamacpp import llamacpp_peer, native_missing
from bench.peer_mstar import kv_bytes, mstar_peer, mstar_plan
from bench.peer_vllm import vllm_peer
from bench.peers import Peer, measured
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import Server
from bench.stats import HIGHER, LOWER
from runtime.launch.server import peak_rss

LENGTHS = (256, 1024, 4096)
RSS_PROMPT = 8191            # + 1 generated token = the model's 8,192 positions
NUM_STREAMS = 8
STREAM_TOKENS = 4000         # background streams outlast the longest prefill; they are cut after it
MSTAR_LABEL = "mstar-run (graphs/smollm2.yaml, fp32, default chunks: --prefill-chunk 256, 1,024 alone)"


def one_token_words() -> list[str]:
    """The words of WORDS that the model's tokenizer (the GGUF's, which mstar serves with) reads as one token
    after a space."""
    from runtime.text.gguf_tokenizer import tokenizer_from_gguf
    from bench.smollm2_fp32 import smollm2_gguf

    tok = tokenizer_from_gguf(smollm2_gguf())
    words = [w for w in prefill_load.WORDS if len(tok.encode(" " + w, add_special_tokens=False)) == 1]
    if len(words) < 2:
        raise Needs(f"one-token words for the prompts; the tokenizer kept {len(words)}")
    return words


class PromptMaker:
    """Prompts of exactly N tokens after the chat template, each with the next nonce (new to every cache)."""

    def __init__(self, words: list[str], overhead: int) -> None:
        self.words, self.overhead, self.nonces = words, overhead, itertools.count(1)

    @classmethod
    def probed(cls, words: list[str], peer: Peer) -> PromptMaker:
        """A maker whose overhead (the template's and the nonce's tokens around the words) the server counted."""
        probe = 64
        got = prefill_load.alone(peer.server.url, peer.model, prefill_load.prompt_words(words, probe, 0), extra=peer.extra)
        return cls(words, got.prompt_tokens - probe)

    def make(self, num_tokens: int) -> prefill_load.Prompt:
        return prefill_load.prompt_words(self.words, num_tokens - self.overhead, next(self.nonces))


def peak_rss_gib(srv: Server) -> float:
    """VmHWM of the largest process the server started (GiB)."""
    peak = peak_rss(srv.proc.pid)
    if not peak:
        raise Needs(f"/proc/<pid>/status of {srv.name}'s processes (Linux)")
    return peak / 2 ** 30


def _side(peer: Peer, maker: PromptMaker, n: int, is_loaded: bool) -> Callable[[], dict[str, float]]:
    url, model, extra = peer.server.url, peer.model, peer.extra

    def run() -> dict[str, float]:
        prompt = maker.make(n)
        if not is_loaded:
            got = prefill_load.alone(url, model, prompt, extra=extra)
            gaps: list[float] = []
        else:
            streams = [maker.make(64) for _ in range(NUM_STREAMS)]
            loaded = prefill_load.loaded(url, model, prompt, streams, STREAM_TOKENS, extra=extra)
            got, gaps, served = loaded.timed, loaded.gaps, sum(loaded.served)
        if got.prompt_tokens != n:
            raise Needs(f"{peer.server.name} to count {n} prompt tokens; it counted {got.prompt_tokens}")
        return {"ttft": got.ttft_s, **({"gap": max(gaps), "served": served} if gaps else {})}
    return measured(peer.counters, run)


def _rss(peer: Peer, maker: PromptMaker) -> dict[str, float]:
    before = peak_rss_gib(peer.server)
    run = measured(peer.counters, lambda: {"ttft": prefill_load.alone(peer.server.url, peer.model, maker.make(RSS_PROMPT),
                                                                      extra=peer.extra).ttft_s})
    return {**run(), "before": before, "after": peak_rss_gib(peer.server)}


def _pair_rows(case: str, a: Peer, b: Peer, samples: dict) -> list[Row]:
    names = (a.name, b.name)
    rows = [Row(case, "TTFT (first content token)", "s", LOWER, Side(a.label, samples[a.name]["ttft"]),
                Side(b.label, samples[b.name]["ttft"]), names=names, plot=f"ttft-{b.name}", x=case)]
    if "gap" in samples[a.name]:
        rows.append(Row(case, f"longest decode gap of {NUM_STREAMS} streams while it prefilled", "s", LOWER,
                        Side(a.label, samples[a.name]["gap"]), Side(b.label, samples[b.name]["gap"]),
                        names=names, plot=f"gap-{b.name}", x=case))
        rows.append(Row(case, f"content chunks the {NUM_STREAMS} streams received while it prefilled", "chunks",
                        HIGHER, Side(a.label, samples[a.name]["served"]), Side(b.label, samples[b.name]["served"]),
                        names=names, plot=f"served-{b.name}", x=case,
                        note="each chunk carries one decode step's text of one stream: the decoding the "
                             "prompt shared the machine with while it waited"))
    return rows


def _rows(ctx: Context, case: str, peers: dict[str, Peer], samples: dict,
          make: Callable[[str, Peer, Peer, dict], list[Row]] = _pair_rows) -> list[Row]:
    """mstar against each peer in `case`, every pair's cache states checked (cold) and recorded first."""
    states = {name: cache_state.from_samples(p.is_cache_enabled, p.cache_source, samples[name])
              for name, p in peers.items()}
    ctx.settings.setdefault("cache_states", {})[case] = {n: [s.to_dict() for s in st] for n, st in states.items()}
    rows = []
    for peer in (p for name, p in peers.items() if name != "mstar"):
        pair_case = f"{case} cold: mstar vs {peer.name}"
        try:
            cache_state.require_same(pair_case, COLD, {"mstar": states["mstar"], peer.name: states[peer.name]})
        except CacheMismatch as exc:
            ctx.record_needs(pair_case, exc)
            continue
        rows += make(f"{case} (cold)", peers["mstar"], peer, samples)
    return rows


def _rss_rows(case: str, a: Peer, b: Peer, samples: dict) -> list[Row]:
    names = (a.name, b.name)
    rows = [Row(case, f"peak RSS of the largest process, {when} the prompt", "GiB", LOWER,
                Side(a.label, samples[a.name][when]), Side(b.label, samples[b.name][when]), names=names,
                note="VmHWM: a lifetime peak (weights, touched KV cache); every side with the same KV budget")
            for when in ("before", "after")]
    return rows + _pair_rows(f"{case} (first run)", a, b, samples)


def _peers(ctx: Context, stack: contextlib.ExitStack) -> dict[str, Peer]:
    kv = kv_bytes(mstar_plan(ctx, "float32"))
    peers = {"mstar": mstar_peer(ctx, stack, "float32", COLD, MSTAR_LABEL, kv)}
    starts = {"vllm": lambda: vllm_peer(ctx, stack, "float32", COLD, kv, max_model_len=RSS_PROMPT + 1),
              "llamacpp": lambda: llamacpp_peer(ctx, stack, "float32", COLD, NUM_STREAMS + 1, kv)}
    for name, start in starts.items():
        try:
            peers[name] = start()
        except Needs as exc:
            ctx.record_needs(f"{name} (every case)", exc)
    ctx.settings["sides"] = {name: p.record() for name, p in peers.items()}
    return peers


@register("prefill", "TTFT of 256 / 1k / 4k-token prompts alone and beside 8 decoding streams, cold caches, mstar-run "
                     "vs vLLM CPU vs llama.cpp's server; peak RSS of an 8k-token prompt")
def run(ctx: Context) -> list[Row]:
    lengths = (256, 1024) if ctx.quick else LENGTHS
    ctx.settings.update(lengths=list(lengths), rss_prompt_tokens=RSS_PROMPT, background_streams=NUM_STREAMS,
                        cache_mode=COLD, mstar_prefill_chunk=256, mstar_prefill_chunk_alone=1024,
                        vllm_chunked_prefill="vLLM defaults", llamacpp_batch="llama.cpp defaults")
    words = one_token_words()
    with contextlib.suppress(Needs):
        if missing := native_missing(ctx):
            ctx.record_needs("llama.cpp built for this CPU", missing)
    with contextlib.ExitStack() as stack:
        peers = _peers(ctx, stack)
        makers = {name: PromptMaker.probed(words, p) for name, p in peers.items()}
        ctx.settings["template_tokens"] = {name: m.overhead for name, m in makers.items()}
        rss = {name: {k: [v] for k, v in _rss(p, makers[name]).items()} for name, p in peers.items()}
        rows = _rows(ctx, f"{RSS_PROMPT} tokens alone", peers, rss, _rss_rows)
        for n, is_loaded in itertools.product(lengths, (False, True)):
            case = f"{n} tokens " + (f"beside {NUM_STREAMS} decoding streams" if is_loaded else "alone")
            sides = {name: _side(p, makers[name], n, is_loaded) for name, p in peers.items()}
            rows += _rows(ctx, case, peers, ctx.alternate(f"prefill {case}", sides, warmup=0))
    return rows
