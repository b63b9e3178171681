"""pi05: π0.5 action chunks, mstar-run's POST /v1/actions vs transformers' PI05ForConditionalGeneration.sample_actions.

Both sides run the same weights: transformers' π0.5 at graphs/pi05.yaml's bench-mid dims (a 4-layer SigLIP of
width 256 on 64 px cameras, a 4-layer Gemma of width 512, a 4-layer action expert of width 256, chunks of 50
actions of 32), seeded random, fp32 (bench.pi05_reference). mstar-run serves the graph's pi05-base mapping at
those dims from the model's tensors written in lerobot's published layout (`--weights ROOT`); each request is
one observation (2 cameras, an instruction, an 8-dim state) posted on its own connection. The reference runs
`sample_actions` in this process over the N observations as one batch (transformers' own batching, prompts
padded on the right to the longest under an attention mask: the processor's way, to the batch's length),
the same noise. Before timing, both sides' chunks of every case are checked equal. Figures: action chunks
per second for N observations at once, N = 1 and 8, STEPS flow steps each.
"""
from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import io
import json
import time
import urllib.request

import yaml

from bench.peer_mstar import compile_plan
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER

CONCURRENCY, QUICK_CONCURRENCY = (1, 8), (1, 2)
STEPS, CAMERAS, STATE_DIM = 10, 2, 8
TASKS = ["pick up the red cup", "open the top drawer", "stack the green block on the blue one", "wipe the table",
         "close the laptop lid", "put the spoon in the bowl", "push the button", "fold the towel in half"]
MSTAR = ("mstar-run POST /v1/actions (graphs/pi05.yaml at bench-mid dims, fp32): the prefix once per request, each "
         "flow step a Run of the action expert batched across requests at any step, reading the prefix's keys and "
         "values where the prefix node left them")
REFERENCE = ("transformers 5.25 PI05ForConditionalGeneration.sample_actions, fp32, in process: the N observations "
             "as one batch (prefix once into its cache, then the expert per step, the cache cropped back each step)")


def _dims() -> dict:
    from mstar_compiler.catalogue.pi05 import PRESETS
    return dict(PRESETS["bench-mid"])


def _write(ctx: Context):
    """The reference model, its published-layout directory under ROOT (with a byte tokenizer), the bench graph."""
    import torch
    from safetensors.torch import save_file

    from bench import pi05_reference as ref
    from bench.byte_tokenizer import write_byte_tokenizer

    hf = ref.model(_dims(), scale=0.02)
    root = ctx.root / "bench-results/weights/pi05-bench-mid-random"
    repo = root / "pi05_base"
    tokenizer = write_byte_tokenizer(repo, ["<bos>", "<eos>", "<image>"], eos="<eos>", bos="<bos>")
    save_file(ref.published_state(hf), str(repo / "model.safetensors"))
    data = yaml.safe_load((ctx.root / "graphs/pi05.yaml").read_text())
    data["presets"]["bench"] = {**data["presets"]["bench-mid"], "random_weights": False,
                                "weights": data["presets"]["pi05-base"]["weights"], "params": {"steps": STEPS}}
    graph = ctx.root / "bench-results/plans/pi05-bench.yaml"
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_text(yaml.safe_dump(data, sort_keys=False))
    torch.set_grad_enabled(False)
    return hf, tokenizer, root, graph


def _observations(n: int):
    """n observations: (instruction, camera PNG data URLs, camera pixels in [-1, 1], state, seed)."""
    import numpy as np
    import torch
    from PIL import Image
    side = _dims()["image_size"]
    out = []
    for i in range(n):
        g = np.random.default_rng(200 + i)
        urls, pixels = [], []
        for _ in range(CAMERAS):
            image = g.integers(0, 256, (side, side, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")
            urls.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
            pixels.append((torch.from_numpy(image).permute(2, 0, 1).float() / 255 - 0.5) / 0.5)
        state = [round(float(v), 3) for v in g.uniform(-1, 1, STATE_DIM)]
        out.append((TASKS[i % len(TASKS)], urls, torch.stack(pixels), state, 30 + i))
    return out


def _mstar(url: str, observations) -> list:
    def one(obs) -> list:
        task, urls, _, state, seed = obs
        body = json.dumps({"instruction": task, "images": urls, "state": state, "seed": seed, "steps": STEPS}).encode()
        request = urllib.request.Request(f"{url}/v1/actions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as resp:
            return json.loads(resp.read())["actions"]
    with concurrent.futures.ThreadPoolExecutor(len(observations)) as pool:
        return list(pool.map(one, observations))


def _reference(hf, tokenizer, observations):
    import torch

    from bench import pi05_reference as ref
    d = _dims()
    patches = (d["image_size"] // d["patch_size"]) ** 2
    prompts = [[d["image_token_id"]] * (CAMERAS * patches)
               + tokenizer.encode("<bos>" + ref.prompt_text(task, torch.tensor(state))).ids
               for task, _, _, state, _ in observations]
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)], mask[b, :len(p)] = torch.tensor(p), 1
    noise = torch.stack([torch.randn((d["chunk_size"], d["max_action_dim"]), generator=torch.Generator().manual_seed(s))
                         for *_, s in observations])
    pixels = torch.stack([obs[2] for obs in observations])
    cameras = torch.ones(len(observations), CAMERAS, dtype=torch.bool)
    return ref.sample(hf, ids, pixels, cameras, noise, STEPS, attention_mask=mask)


def _per_second(fn, n: int) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"rate": n / (time.perf_counter() - start)}


@register("pi05", "π0.5 (bench-mid) action chunks: mstar-run vs transformers' sample_actions, 1 and 8 at once")
def run(ctx: Context) -> list[Row]:
    import importlib.util
    if importlib.util.find_spec("transformers.models.pi05") is None:
        raise Needs("transformers with π0.5 (transformers.models.pi05), the reference side")
    import torch
    hf, tokenizer, root, graph = _write(ctx)
    plan = compile_plan(graph, ctx.root / "bench-results/plans/pi05-bench.plan.bin", "--preset", "bench")
    levels = QUICK_CONCURRENCY if ctx.quick else CONCURRENCY
    ctx.settings.update(concurrency=list(levels), steps=STEPS, cameras=CAMERAS, dims="bench-mid", dtype="fp32",
                        reference_torch_threads=torch.get_num_threads(), weights=str(root))
    rows = []
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(mstar_run(plan, ctx.root / "bench-results/logs/mstar-pi05.log", "mstar-run (pi05)",
                                            ctx.threads, "--weights", str(root)))
        for n in levels:
            observations = _observations(n)
            mine, theirs = torch.tensor(_mstar(srv.url, observations)), _reference(hf, tokenizer, observations)
            # fp32 through a few layers in another order of reductions (batched, padded: reassociation)
            if not torch.allclose(mine, theirs, atol=1e-3, rtol=1e-3):
                raise AssertionError(f"N={n}: mstar's and transformers' chunks differ by "
                                     f"{(mine - theirs).abs().max().item():.3g}")
            samples = ctx.alternate(f"pi05 N={n}", {
                "mstar": lambda: _per_second(lambda: _mstar(srv.url, observations), n),
                "transformers": lambda: _per_second(lambda: _reference(hf, tokenizer, observations), n),
            }, warmup=0)    # the agreement check ran both once
            rows.append(Row(f"pi05 bench-mid {n} at once", "action chunks per second", "chunk/s", HIGHER,
                            Side(MSTAR, samples["mstar"]["rate"]), Side(REFERENCE, samples["transformers"]["rate"]),
                            None, plot="pi05-rate-vs-concurrency", x=n, xlabel="observations at once",
                            note=f"{CAMERAS} cameras of {_dims()['image_size']} px, {STEPS} flow steps, "
                                 f"chunks of {_dims()['chunk_size']}, fp32; chunks equal"))
    return rows
