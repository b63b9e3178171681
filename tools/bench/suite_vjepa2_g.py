"""vjepa2-g: V-JEPA 2-AC whole (ViT-g/16 encoder + 24-layer AC predictor), mstar-run's /v1/rollouts vs Meta's code.

Both sides run the same weights (bench.vjepa2_g_weights: Meta's hub entry builds the model, its state dicts are
written in the published layout) in bf16 (graphs/vjepa2_ac.yaml's `vitg` preset dtype; Meta's modules cast
to bf16 and run under torch.autocast, as Meta's own code runs bf16: its rotary embedding computes in fp32). mstar-run serves the preset with `--weights` and answers `POST /v1/rollouts` (one context frame,
duplicated into a 2-frame tubelet as Meta's world-model wrapper does, sent as PNG; predictions returned
base64): the encoder once, then one predictor step per frame over a per-frame KV cache. The native side runs
Meta's modules in this process as its world model does (bench.vjepa2_meta.meta_world_model): encode, then
re-run the predictor over the whole trajectory at every step (cc-vjepa2's models, the loop restated from
upstream's notebooks). One rollout of batch 1 per run, horizons 4, 15 and 30, rounds alternated; before
timing, each horizon's predictions are compared (cosine similarity per predicted frame, bf16 on both sides:
the first frame must agree to 0.99, and the least agreement over the rollout is in the row's note).
The M* paper's speed-ups on an H100 (2.08x / 3.76x / 12.5x) are the rows' anchors.
"""
from __future__ import annotations

import base64
import contextlib
import io
import json
import time
import urllib.request

from bench.peer_mstar import compile_plan
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER
from bench.vjepa2_g_weights import ensure, load_meta

HORIZONS, QUICK_HORIZONS = (4, 15, 30), (2, 4)
ANCHORS = {4: 2.08, 15: 3.76, 30: 12.5}
IMAGE, ACTION_DIM = 256, 7
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)      # ImageNet's, as V-JEPA 2's transforms
MIN_FIRST_COSINE = 0.99
MSTAR = ("mstar-run /v1/rollouts, graphs/vjepa2_ac.yaml vitg preset (bf16): encoder once, then one predictor "
         "step per frame over a per-frame KV cache (DynamicLoop)")
NATIVE = ("Meta's V-JEPA 2-AC code (cc-vjepa2's vision_transformer + ac_predictor, its hub entry), bf16 weights "
          "under torch.autocast, in process: the world model's rollout, the predictor re-run over the whole trajectory each step")


def _inputs(horizon: int):
    """One context frame (as PNG, and as the normalised clip Meta's side takes), its state and the actions."""
    import torch
    from PIL import Image

    g = torch.Generator().manual_seed(horizon)
    pixels = torch.randint(0, 256, (IMAGE, IMAGE, 3), dtype=torch.uint8, generator=g)
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buf, format="PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    x = (pixels.permute(2, 0, 1).float() / 255.0 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    clip = x[None, :, None].repeat(1, 1, 2, 1, 1)                   # (1, 3, 2, H, W): the frame twice
    states = 0.1 * torch.randn(1, 1, ACTION_DIM, generator=g)
    actions = 0.05 * torch.randn(1, horizon, ACTION_DIM, generator=g)
    return png, clip, states, actions


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/rollouts", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as resp:
        return json.loads(resp.read())


def _mstar_rollout(url: str, model: str, png: str, states, actions):
    import torch

    answer = _post(url, {"model": model, "frames": [png, png], "states": states[0].tolist(),
                         "actions": actions[0].tolist(), "encoding_format": "base64"})
    flat = torch.frombuffer(bytearray(base64.b64decode(answer["embeddings"])), dtype=torch.float32)
    return flat.view(*answer["shape"])


def _agreement(mstar, native) -> list[float]:
    """Cosine similarity of each predicted frame, flattened (mstar (H, P, E) vs native (1, H, P, E))."""
    from torch.nn import functional as F

    return F.cosine_similarity(mstar.flatten(1), native[0].float().flatten(1), dim=1).tolist()


def _timed(fn) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"time": time.perf_counter() - start}


def _case(ctx: Context, url: str, model: str, encoder, predictor, horizon: int) -> Row:
    import torch

    from bench.vjepa2_meta import meta_world_model

    png, clip, states, actions = _inputs(horizon)
    clip = clip.to(torch.bfloat16)
    s, a = states.to(torch.bfloat16), actions.to(torch.bfloat16)

    def native():
        with torch.autocast("cpu", dtype=torch.bfloat16):    # Meta's code runs bf16 under autocast
            return meta_world_model(encoder, predictor, clip, s, a, horizon)

    cosine = _agreement(_mstar_rollout(url, model, png, states, actions), native())
    if cosine[0] < MIN_FIRST_COSINE:
        raise Needs(f"mstar's and Meta's first predicted frame to agree (cosine {cosine[0]:.4f} < {MIN_FIRST_COSINE})")
    samples = ctx.alternate(f"vjepa2-g H={horizon}", {
        "mstar": lambda: _timed(lambda: _mstar_rollout(url, model, png, states, actions)),
        "native": lambda: _timed(native),
    }, warmup=0)      # the agreement check ran both once
    return Row(f"V-JEPA 2-AC ViT-g H={horizon}", "rollout time", "s", LOWER, Side(MSTAR, samples["mstar"]["time"]),
               Side(NATIVE, samples["native"]["time"]), ANCHORS.get(horizon), plot="vjepa2-g-time-vs-horizon",
               x=horizon, xlabel="horizon H (frames)",
               note=f"batch 1, one context frame, 256 patch tokens/frame, bf16; cosine per predicted frame "
                    f"{cosine[0]:.4f} (first) .. {min(cosine):.4f} (least)")


@register("vjepa2-g", "V-JEPA 2-AC whole (ViT-g encoder, 24-layer predictor): mstar-run /v1/rollouts vs Meta's "
                      "code re-running the predictor each step, H = 4 / 15 / 30")
def run(ctx: Context) -> list[Row]:
    import torch

    files = ensure(ctx)
    encoder, predictor = load_meta(files, torch.bfloat16)
    plan = compile_plan(ctx.root / "graphs/vjepa2_ac.yaml", ctx.root / "bench-results/plans/vjepa2-g.plan.bin",
                        "--preset", "vitg", "--device-memory", "6GiB")
    horizons = QUICK_HORIZONS if ctx.quick else HORIZONS
    ctx.settings.update(horizons=list(horizons), batch=1, context_frames=1, image_size=IMAGE, dtype="bf16",
                        weights=str(files.root), native_torch_threads=torch.get_num_threads())
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(mstar_run(plan, ctx.root / "bench-results/logs/mstar-vjepa2-g.log",
                                            "mstar-run (vjepa2-ac vitg)", ctx.threads, "--weights", str(files.root)))
        with urllib.request.urlopen(srv.url + "/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        return [_case(ctx, srv.url, model, encoder, predictor, h) for h in horizons]
