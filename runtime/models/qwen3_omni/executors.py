"""Qwen3-Omni speech on the worker: thinker stream, talker, code predictor, code2wav.

How the plan's tracks map onto these executors (graphs/qwen3_omni.yaml, task voice_chat):

  thinker track   `ThinkerExecutor` (thinker.py): a decoder LM whose `hidden` output is the stream item
                  the talker reads — the *input embeddings* of the tokens it fed this step
                  (`hidden`), their ids (`hidden:ids`) and, on the first item, the embeddings
                  of tts_bos / tts_eos / tts_pad (`hidden:tts`). The shared `qwen3_moe_lm`
                  decoder returns only its final-normed states, so the embeddings come from
                  the thinker's own table (`DecoderLM.embed`). Audio and image prompt rows
                  reach the thinker as its `embeds` at their placeholder ids (audio, image,
                  video pads), with 3-D M-RoPE positions and DeepStack for pictures. The prompt's
                  item also carries the layer-`accept_hidden_layer` states at those pads
                  (`hidden:mm`), which the talker's prompt takes there.
  audio_enc       `AudioEncoderExecutor`: 16 kHz waveforms, or a live utterance's windows from the
                  `user_audio` stream -> (T_i, thinker hidden), batched (the encoder pads every
                  chunk alone, so a batch equals its members alone).
  vision_enc      `VisionEncoderExecutor`: processed pixels (vision_inputs.py) -> hidden (T_i, thinker
                  hidden) and deepstack (D, T_i, thinker hidden), batched (attention stays per frame).
  talker track    `TalkerExecutor` (one talker step per Run: its first Run takes the
                  prompt item and the first generated token's item and prefills the talker
                  prompt; later Runs add one thinker row, or tts_eos / tts_pad once the
                  thinker has ended) then `CodePredictorExecutor` (residual codebooks); the
                  frame goes onto the `codec_frames` stream unless the talker said codec EOS,
                  which it reports as `finished="eos"` to end the `speak` loop.
  code2wav track  `Code2WavExecutor`, per chunk of `codec_frames` (left context 25 + 25).

The talker and code predictor decode greedily (as the reference loop's `speak_step`,
tests/runtime/models/qwen3_omni/speech_reference.py).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import CachelessExecutor, ExecResult, Executor
from runtime.model_executor.kv import BlockTables
from runtime.model_executor.kv.run_rows import KVRowRule, KVRows
from runtime.models.qwen3_omni.thinker import ThinkerExecutor
from runtime.models.qwen3_omni.talker_prompt import TalkerText, prompt_rows, talker_prompt
from runtime.streams.chunk_policy import Chunk
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.model_executor.parallel.cpu_linear import device_of

DEFAULT_SPEAKER = "ethan"


class AudioEncoderExecutor(CachelessExecutor):
    """The `qwen3_omni_audio_encoder` node: each request's waveform (S,) -> hidden (T, output_dim).

    A realtime session's utterance arrives on the `mel` stream port (graphs/qwen3_omni.yaml's
    `user_audio`, one unfloored log10 mel frame (num_mel_bins,) per item), one encoder attention
    window per chunk; the floor at (loudest - 8) takes the loudest frame of the request so far
    (runtime/models/qwen3_omni/mel_featuriser.py says when that differs from the whole file's).
    The family param `audio_input` (AUDIO_INPUTS) says what the `audio` port holds: "waveform", or
    "rows" — encoder rows (T, output_dim) this node computed for a session's windows, passed on.
    """

    def __init__(self, node: Node, encoder: nn.Module) -> None:
        self.encoder = encoder
        self.device = device_of(encoder)
        self.output_dim = int(node.dims["output_dim"])
        self._inputs: dict[int, str] = {}
        self._loudest: dict[int, float] = {}      # streamed requests: the largest log10 mel value so far

    def open(self, request_id: int, params: RequestParams) -> None:
        kind = str(params.family.get("audio_input", "waveform"))
        if kind not in AUDIO_INPUTS:
            raise ValueError(f"family param audio_input must be one of {AUDIO_INPUTS}, got {kind!r}")
        self._inputs[request_id] = kind

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self._inputs.pop(request_id, None)
            self._loudest.pop(request_id, None)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, Any]]) -> list[ExecResult]:
        out: list[torch.Tensor | None] = [None] * len(items)
        waves, windows = [], {}
        for i, (item, ins) in enumerate(zip(items, inputs)):
            if "mel" in ins:
                windows[i] = self._window(item.request_id, ins["mel"])
            elif self._inputs.get(item.request_id) == "rows":
                out[i] = ins["audio"].to(self.device, torch.float32)
            else:
                waves.append(i)
        for i, h in zip(waves, self.encoder.encode([inputs[i]["audio"].to(self.device, torch.float32)
                                                    for i in waves]) if waves else []):
            out[i] = h
        full = [i for i, w in windows.items() if w.shape[1]]
        for i, h in zip(full, self.encoder([windows[i] for i in full]) if full else []):
            out[i] = h
        for i in windows.keys() - set(full):   # the commit fell on a window boundary: an empty final chunk
            out[i] = torch.zeros(0, self.output_dim, device=self.device)
        return [ExecResult(outputs={"hidden": h}) for h in out]

    def _window(self, request_id: int, chunks: list[Chunk]) -> torch.Tensor:
        """One streamed window, normalised: (num_mel_bins, F) as mel.py's log_mel ends."""
        frames = [it["value"] for it in _items(chunks)]
        if not frames:
            return torch.zeros(0, 0)
        log_mel = torch.stack(frames, dim=1).to(self.device, torch.float32)             # (bins, F)
        loudest = max(self._loudest.get(request_id, -math.inf), float(log_mel.max()))
        self._loudest[request_id] = loudest
        return (torch.maximum(log_mel, torch.tensor(loudest - 8.0)) + 4.0) / 4.0


AUDIO_INPUTS = ("waveform", "rows")


class VisionEncoderExecutor(CachelessExecutor):
    """The `qwen3_omni_vision_encoder` node: each request's pixels (3, H, W) or frames (F, 3, H, W)."""

    def __init__(self, node: Node, encoder: nn.Module) -> None:
        self.encoder = encoder
        self.device = device_of(encoder)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        dtype = next(self.encoder.parameters()).dtype
        out = self.encoder.encode_pixels([ins["image"].to(self.device, dtype) for ins in inputs])
        return [ExecResult(outputs={"hidden": h, "deepstack": d}) for h, d in out]


def _items(chunks: list[Chunk]) -> list[dict[str, torch.Tensor]]:
    return [it for c in chunks for it in c.new_items]


class TalkerExecutor(Executor):
    """The `qwen3_omni_talker` node: paged KV cache, per-request text rows, codebook 0.

    The conductor owns its block tables (runtime/conductor/kv_ledger.py): a Run's rows are not its tokens
    (it has none), so the family declares how many each writes (`talker_kv_rows`: the prompt's on a request's
    first Run, `prompt_rows` of its thinker prompt, then one), and each Run is told what changed in its table."""

    def __init__(self, node: Node, talker: nn.Module, rank: int) -> None:
        pool = next(p for p in node.kv_pools if p.rank == rank)
        self.talker = talker
        self.kv_blocks, self.kv_block_size = pool.num_blocks, pool.block_tokens
        self.cache = talker.make_kv_cache(pool.num_blocks, pool.block_tokens)
        self.blocks = BlockTables(pool.num_blocks, pool.block_tokens)
        self.device = self.cache.k[0].device
        self.eos = int(talker.dims["codec_eos_token_id"])
        self._texts: dict[int, TalkerText] = {}
        self._speakers: dict[int, str] = {}

    def open(self, request_id: int, params: RequestParams) -> None:
        # the speech endpoints' voice (`RequestParams.family`); the native task endpoint names none
        self._speakers[request_id] = str(params.family.get("speaker", DEFAULT_SPEAKER))

    def close(self, request_id: int, kv_only: bool) -> None:
        self.blocks.free(request_id)
        if not kv_only:
            self._texts.pop(request_id, None)
            self._speakers.pop(request_id, None)

    def kv_used_blocks(self) -> int:
        return self.blocks.used_blocks()

    def _rows(self, item: WorkItem, ins: dict[str, Any]) -> torch.Tensor:
        """This step's input rows (n, hidden): the prompt on the first Run, else one decode row."""
        rid, chunks = item.request_id, ins.get("thinker_hidden", [])
        news = [{k: v.to(self.device) for k, v in it.items()} for it in _items(chunks)]   # from another rank: CPU
        if rid not in self._texts:
            head, rest = news[:2], news[2:]
            embeds = torch.cat([it["value"] for it in head])                     # (T+1, Dt)
            rows = talker_prompt(self.talker, head[0]["ids"], embeds, head[0].get("mm"), head[0]["tts"],
                                 self._speakers.get(rid, DEFAULT_SPEAKER))
            if rows.shape[0] != prompt_rows(head[0]["ids"].tolist(), self.talker.dims):    # what was charged
                raise ValueError(f"request {rid}: a talker prompt of {rows.shape[0]} rows, not the "
                                 f"{prompt_rows(head[0]['ids'].tolist(), self.talker.dims)} its prompt ids make")
            self._texts[rid] = TalkerText(self.talker, head[0]["tts"])
        else:
            rows, rest = None, news
        text = self._texts[rid]
        if rest:
            text.push(torch.cat([it["value"] for it in rest]))
        if any(c.is_final for c in chunks):
            text.finish()
        return rows if rows is not None else (ins["frame_embed"].to(self.device) + text.next_row())[None]   # (1, H)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, Any]]) -> list[ExecResult]:
        rows = [self._rows(item, ins) for item, ins in zip(items, inputs)]
        for item, r in zip(items, rows):      # the table as the conductor told it, holding the Run's rows
            self.blocks.take(item.request_id, item.kv_at, item.kv_blocks, item.kv_copies, self.cache)
            self.blocks.grow(item.request_id, r.shape[0])
        schedule = [(item.request_id, r.shape[0]) for item, r in zip(items, rows)]
        batch = self.blocks.metadata(schedule, device=self.device)
        positions = torch.cat([torch.arange(self.blocks.num_tokens(rid) - n, self.blocks.num_tokens(rid),
                                            device=self.device) for rid, n in schedule])
        hidden = self.talker(torch.cat(rows), positions, batch, self.cache)[batch.last_token_rows()]  # (B, H)
        logits = self.talker.compute_logits(hidden).masked_fill(~self.talker.speakable(), float("-inf"))
        code0 = logits.argmax(dim=-1)                                                          # (B,)
        prefix = torch.stack((hidden, self.talker.embed_codes(code0)), dim=1)                  # (B, 2, H)
        return [ExecResult(tokens=[int(c)], outputs={"code0": code0[b:b + 1], "hidden": prefix[b]},
                           finished="eos" if int(c) == self.eos else "")
                for b, c in enumerate(code0)]


class CodePredictorExecutor(CachelessExecutor):
    """The `qwen3_omni_code_predictor` node: codebooks 1..G-1 of each speaking request's frame.

    No KV pool: each frame is a fresh sequence whose cache lives for one call."""

    def __init__(self, node: Node, predictor: nn.Module, codec_eos: int) -> None:
        self.predictor = predictor
        self.device = device_of(predictor)
        self.codec_eos = codec_eos
        self.hidden_size = int(node.dims["hidden_size"])

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        speaking = [i for i, ins in enumerate(inputs) if int(ins["code0"][0]) != self.codec_eos]
        results = [ExecResult(outputs={"frame_embed": torch.zeros(self.hidden_size, device=self.device)})
                   for _ in items]
        if speaking:
            prefix = torch.stack([inputs[i]["hidden"] for i in speaking]).to(self.device)    # (B', 2, H)
            code0 = torch.cat([inputs[i]["code0"] for i in speaking]).to(self.device)        # (B',)
            frames, embeds = self.predictor.predict_frames(prefix, code0)
            for j, i in enumerate(speaking):
                results[i] = ExecResult(outputs={"frame": frames[j], "frame_embed": embeds[j]})
        return results


class Code2WavExecutor(CachelessExecutor):
    """The `qwen3_omni_code2wav` node: one left-context chunk of codec frames per request per Run."""

    def __init__(self, node: Node, module: nn.Module) -> None:
        self.module = module
        self.num_quantizers = int(node.dims["num_quantizers"])
        self.device = device_of(module)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, Any]]) -> list[ExecResult]:
        chunks: list[Chunk] = [ins["codes"][0] if ins.get("codes") else Chunk([], 0, 0, True) for ins in inputs]
        frames = [torch.stack([it["value"] for it in c.items]).to(self.device) if c.items
                  else torch.zeros(0, self.num_quantizers, dtype=torch.long, device=self.device)
                  for c in chunks]                                                             # (F_i, G)
        audio = self.module.decode_chunks(frames, [c.num_context for c in chunks])
        return [ExecResult(outputs={"audio": a.float().cpu()}) for a in audio]


def tts_token_ids(talker_dims: Mapping[str, Any]) -> tuple[int, int, int]:
    """Thinker ids of tts_bos, tts_eos, tts_pad (the talker's text-side specials)."""
    return (int(talker_dims["tts_bos_token_id"]), int(talker_dims["tts_eos_token_id"]),
            int(talker_dims["tts_pad_token_id"]))


def _talker(plan: Plan, node: Node) -> Node:
    talker = next((n for n in plan.nodes if n.kind == "qwen3_omni_talker"), None)
    if talker is None:
        raise ValueError(f"node '{node.name}' ({node.source}) runs executor {node.executor} in a graph "
                         f"without a qwen3_omni_talker node")
    return talker


def thinker_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> ThinkerExecutor:
    talker = _talker(plan, node).dims
    pads = tuple(int(talker[k]) for k in ("audio_token_id", "image_token_id", "video_token_id"))
    vision = next((n.dims for n in plan.nodes if n.kind == "qwen3_omni_vision_encoder"), None)
    return ThinkerExecutor(node, module, rank, tts_token_ids(talker), pads, plan, vision, pads[1:],
                           int(talker["accept_hidden_layer"]))


def vision_encoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> VisionEncoderExecutor:
    return VisionEncoderExecutor(node, module)


def audio_encoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> AudioEncoderExecutor:
    return AudioEncoderExecutor(node, module)


def talker_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> TalkerExecutor:
    return TalkerExecutor(node, module, rank)


def talker_kv_rows(plan: Plan, node: Node) -> KVRowRule:
    """The rows a talker Run writes, for the conductor (`Family.kv_rows`): the talker prompt's on a
    request's first Run (`prompt_rows` of its prompt ids), else one; never keyed."""
    dims = node.dims
    return lambda run: KVRows(1 if run.held else prompt_rows(run.prompt_ids(), dims))


def code_predictor_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> CodePredictorExecutor:
    return CodePredictorExecutor(node, module, int(_talker(plan, node).dims["codec_eos_token_id"]))


def code2wav_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> Code2WavExecutor:
    return Code2WavExecutor(node, module)
