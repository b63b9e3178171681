"""Factories for the BAGEL executor tests: a rank's executors built from the compiled tiny plan,
a driver that feeds them WorkItems the way the conductor and worker do, and an oracle that
runs BAGEL's call sequence (runtime/models/bagel/__init__.py) on the same modules, one segment
per call, every CFG branch computed."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.models.bagel.generation import Generation, GuidanceUse, vae_resize, vit_resize
from runtime.models.bagel.segments import Segment, SegmentKind as K
from runtime.models.bagel.cfg_combine import CfgRequest
from runtime.worker.executors import executor_for
from runtime.conductor.local_run import LocalGroup
from runtime.conductor.request import SizedInput
from runtime.models.bagel.node_executors import image_tensor
from runtime.model_executor.kv import KVBlockManager
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.model_executor.weights.sources import WeightOptions
from runtime.worker.loader import load_rank
from tests.runtime.serving.conftest import REPO

LMS = ("llm", "llm_cfg_text", "llm_cfg_img")
ROLES = dict(zip(LMS, ("full", "cfg_text", "cfg_img")))


def bagel_params(flat: dict[str, Any]) -> RequestParams:
    """A request's params from one flat dict, split as the server resolves them: `seed` samples,
    `width`/`height` are the image API's (family) values, the rest graph params."""
    family = {k: flat[k] for k in ("width", "height") if k in flat}
    declared = {k: v for k, v in flat.items() if k not in family and k != "seed"}
    return RequestParams(declared, SamplingParams(seed=flat.get("seed")), family)


def tiny_plan(placement: str = "single"):
    return compile_file(str(REPO / "graphs" / "bagel.yaml"), Options(preset="tiny", placement=placement)).plan


def rank_executors(plan, rank: int = 0, options: WeightOptions | None = None
                   ) -> tuple[dict[str, Any], dict[str, torch.nn.Module]]:
    """name -> executor of one rank, as the worker builds them (its linears packed: the packed copy is each
    weight's only one), and name -> the same modules with their dense weights, built again, for oracles."""
    modules = load_rank(plan, rank, options)
    executors = {name: executor_for(plan.node(name), module, rank, plan) for name, (module, _) in modules.items()}
    return executors, {name: module for name, (module, _) in load_rank(plan, rank, options, pack=False).items()}


class Driver:
    """Feeds executors the items the conductor would send, the LM nodes' tables kept as the conductor keeps
    them (`LocalGroup`); keeps each request's values like a worker."""

    def __init__(self, plan, executors: dict[str, Any], prefix_cache: bool = True) -> None:
        self.ex = executors
        self.lms = LocalGroup(plan, {n: executors[n] for n in LMS}, prefix_cache)
        self.values: dict[int, dict[str, torch.Tensor]] = {}
        self.pictures: dict[int, SizedInput] = {}     # request -> the picture its encoders read last

    def open(self, rid: int, params: dict[str, Any]) -> None:
        for ex in self.ex.values():
            ex.open(rid, bagel_params(params))

    def close(self, rid: int, kv_only: bool = False) -> None:
        self.lms.close(rid, kv_only)
        for name, ex in self.ex.items():
            if name not in LMS:
                ex.close(rid, kv_only)

    def group(self, calls: list[tuple[str, list[WorkItem], list[dict]]]) -> None:
        """Batches of LM nodes as one call (the worker's grouping); the others one by one."""
        lm = [c for c in calls if c[0] in LMS]
        other = [c for c in calls if c[0] not in LMS]
        for _, items, inputs in other:
            for item, ins in zip(items, inputs):
                if "image" in ins:
                    self.pictures[item.request_id] = SizedInput(ins["image"], 0)
        results = self.lms.run(lm, self.pictures) if lm else []
        results += [self.ex[n].run(items, ins) for n, items, ins in other]
        for (name, items, _), batch in zip(lm + other, results):
            for item, result in zip(items, batch):
                for port, t in result.outputs.items():
                    self.values.setdefault(item.request_id, {})[f"{name}.{port}"] = t

    def value(self, rid: int, key: str) -> torch.Tensor:
        return self.values[rid][key]

    def draw(self, rids: list[int], steps: int) -> None:
        """The draw walk for several requests: per step one LM call (3 branches), one cfg call."""
        for step in range(steps - 1):
            ins = [{"latent": self.value(r, "cfg.latent")} if step else {} for r in rids]
            self.group([(n, [WorkItem(r, step=step, walk="draw") for r in rids], ins) for n in LMS])
            cfg_ins = [{"v_full": self.value(r, "llm.velocity"), "v_text": self.value(r, "llm_cfg_text.velocity"),
                        "v_img": self.value(r, "llm_cfg_img.velocity"), **({"latent": self.value(r, "cfg.latent")}
                                                                           if step else {})} for r in rids]
            self.group([("cfg", [WorkItem(r, step=step, walk="draw") for r in rids], cfg_ins)])
        self.group([("vae_dec", [WorkItem(r, walk="draw") for r in rids],
                     [{"latent": self.value(r, "cfg.latent")} for r in rids])])


class Oracle:
    """BAGEL's contexts and generation loop for one request, straight on the components."""

    def __init__(self, plan, modules: dict[str, torch.nn.Module], params: dict[str, Any]) -> None:
        self.plan, self.m, self.params = plan, modules, bagel_params(params)
        self.lm = modules["llm"]
        self.cache = self.lm.make_kv_cache(256, 16)
        self.blocks = KVBlockManager(256, 16)
        self.rope: dict[str, int] = {}
        for seq in ROLES.values():
            self.blocks.allocate(seq, 0)
            self.rope[seq] = 0

    def write(self, seq: str, kind: K, **inputs) -> None:
        seg = Segment(kind, self.blocks.num_tokens(seq), self.rope[seq], **inputs)
        self.cache.copy_blocks(self.blocks.append(seq, seg.num_rows(self.lm.patch)))
        seg = dataclasses.replace(seg, block_table=tuple(self.blocks.table(seq).blocks))
        self.rope[seq] = self.lm([seg], self.cache).states[0][1]

    def fork(self, src: str, dst: str) -> None:
        self.blocks.free(dst)
        self.blocks.fork(src, dst)
        self.rope[dst] = self.rope[src]

    def image(self, image: torch.Tensor) -> None:
        """An input image: VAE on full, then ViT on full, then cfg_text = full."""
        lm_dims = self.plan.node("llm").dims
        latent = self.m["vae_enc"]([image_tensor(image, vae_resize(lm_dims))])[0]
        self.write("full", K.VAE, latent=latent)
        embeds = self.m["vit"]([image_tensor(image, vit_resize(self.plan.node("vit").dims))])[0]
        self.write("full", K.VIT, embeds=embeds)
        self.fork("full", "cfg_text")

    def text(self, ids: list[int]) -> None:
        self.write("full", K.TEXT, tokens=torch.tensor(ids))
        self.write("cfg_img", K.TEXT, tokens=torch.tensor(ids))

    def generate(self) -> torch.Tensor:
        gen = Generation.from_params(self.params, self.plan.node("llm").dims)
        cfg_node = self.plan.node("cfg")
        use = GuidanceUse.of(cfg_node.args, cfg_node.param_args, self.params)
        x = gen.noise(16)
        for step in range(gen.steps - 1):
            t, t_next = gen.step_times(step)
            v = {}
            for seq in ROLES.values():
                seg = Segment(K.GEN, self.blocks.num_tokens(seq), self.rope[seq],
                              tuple(self.blocks.table(seq).blocks), latent=x, timestep=t)
                v[seq] = self.lm([seg], self.cache).outputs[0]
            x = self.m["cfg"]([CfgRequest(x, v["full"], v["cfg_text"], v["cfg_img"], t, t_next,
                                          use.text_scale, use.img_scale)])[0]
        return self.m["vae_dec"]([x])[0]
