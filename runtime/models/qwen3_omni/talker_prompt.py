"""The talker's prefill rows, cut from the thinker's prompt as Qwen3-Omni does it.

For one request, from the thinker's prompt ids and its per-token states:
  * every position of a *user* turn (the role token after its `<|im_start|>` is `user`)
    becomes one talker row: `hidden_projection` of the thinker's layer-`accept_hidden_layer`
    state at audio/image/video placeholder positions, `text_projection` of the thinker's
    token embedding elsewhere; system turns and earlier assistant turns are dropped;
  * the last assistant turn contributes nine rows, text part + codec part:
        text:  im_start, "assistant", "\n", tts_pad x4, tts_bos, first generated token
        codec: 0, 0, 0, nothink, think_bos, think_eos, speaker, codec_pad, codec_bos
    (text rows through `text_projection`, codec rows through the talker's codec embedding).
Every later generated token's embedding feeds one talker decode step (`TalkerText`), then
`tts_eos` once, then `tts_pad` until the talker says codec EOS.

So the talker can prefill as soon as the thinker has sampled its first token. Positions
are 0..P-1 for text-only prompts; prompts with audio/image/video need the 3-D M-RoPE
positions of the thinker's rope index over the same rows (computed by the thinker side).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

if TYPE_CHECKING:
    from runtime.models.qwen3_omni.qwen3_omni_talker import Qwen3OmniTalker

NUM_ASSISTANT_TEXT_ROWS = 4  # im_start, "assistant", "\n", first generated token
NUM_ASSISTANT_ROWS = NUM_ASSISTANT_TEXT_ROWS + 5   # with the four tts_pad rows and tts_bos between them


def user_positions(prompt_ids: torch.Tensor, dims: Mapping[str, Any]) -> torch.Tensor:
    """(U,) positions of the prompt that belong to user turns, in order."""
    t = prompt_ids.shape[0]
    index = torch.arange(t, device=prompt_ids.device)
    starts = torch.where(prompt_ids == dims["im_start_token_id"], index, torch.full_like(index, -1))
    turn_start = torch.cummax(starts, dim=0).values.clamp_min(0)
    role = prompt_ids[(turn_start + 1).clamp_max(t - 1)]
    return index[role == dims["user_token_id"]]


def assistant_start(prompt_ids: torch.Tensor, dims: Mapping[str, Any]) -> int:
    """Position of the `<|im_start|>` that opens the last assistant turn."""
    opens = (prompt_ids[:-1] == dims["im_start_token_id"]) & (prompt_ids[1:] == dims["assistant_token_id"])
    found = opens.nonzero().flatten()
    if not len(found):
        raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn for the talker to speak")
    return int(found[-1])


def prompt_rows(prompt_ids: Sequence[int], dims: Mapping[str, Any]) -> int:
    """How many rows `talker_prompt` makes of a thinker prompt: one per user-turn position, and the
    assistant turn's (what the conductor charges the talker's first Run; runtime/models/qwen3_omni/executors.py)."""
    return len(user_positions(torch.tensor(list(prompt_ids), dtype=torch.long), dims)) + NUM_ASSISTANT_ROWS


def talker_prompt(talker: Qwen3OmniTalker, prompt_ids: torch.Tensor, thinker_embeds: torch.Tensor,
                  thinker_mm_hidden: torch.Tensor | None, tts_embeds: torch.Tensor, speaker: str) -> torch.Tensor:
    """(P, hidden_size) talker prefill rows of one request.

    prompt_ids (T,) thinker prompt; thinker_embeds (>= T+1, Dt) thinker token embeddings of
    the prompt and the first generated token; thinker_mm_hidden (T, Dt) the thinker's
    layer-`accept_hidden_layer` states (needed only where the prompt has multimodal
    placeholders); tts_embeds (3, Dt) thinker embeddings of tts_bos, tts_eos, tts_pad.
    """
    d = talker.dims
    users = user_positions(prompt_ids, d)
    is_mm = torch.isin(prompt_ids[users], torch.tensor([d["audio_token_id"], d["image_token_id"],
                                                       d["video_token_id"]], device=prompt_ids.device))
    user_rows = talker.project_text(thinker_embeds[users])
    if is_mm.any():
        user_rows[is_mm] = talker.project_hidden(thinker_mm_hidden[users[is_mm]])
    start = assistant_start(prompt_ids, d)
    said = talker.project_text(thinker_embeds[start: start + NUM_ASSISTANT_TEXT_ROWS])
    bos, _, pad = talker.project_text(tts_embeds)
    text = torch.cat((said[:3], pad.expand(4, -1), bos[None], said[3:]))
    codec_ids = [d["codec_nothink_id"], d["codec_think_bos_id"], d["codec_think_eos_id"],
                 d["speaker_id"][speaker.lower()], d["codec_pad_id"], d["codec_bos_id"]]
    codec = talker.embed_codes(torch.tensor(codec_ids, device=prompt_ids.device))
    codec = torch.cat((codec.new_zeros(3, codec.shape[1]), codec))[: text.shape[0]]
    return torch.cat((user_rows, text + codec))


class TalkerText:
    """The text rows one request's talker consumes, one per decode step.

    The thinker pushes the embedding of each token it generates after the first; when it
    finishes, the talker gets tts_eos once and tts_pad from then on.
    """

    def __init__(self, talker: Qwen3OmniTalker, tts_embeds: torch.Tensor) -> None:
        self._talker = talker
        _, self._eos, self._pad = talker.project_text(tts_embeds)
        self._rows: deque[torch.Tensor] = deque()
        self._is_finished = False
        self._is_eos_sent = False

    def push(self, thinker_embeds: torch.Tensor) -> None:
        """Thinker token embeddings (n, Dt), in order."""
        self._rows.extend(self._talker.project_text(thinker_embeds))

    def finish(self) -> None:
        self._is_finished = True

    def is_ready(self) -> bool:
        """Whether the next decode step has its text row (else it waits for the thinker)."""
        return bool(self._rows) or self._is_finished

    def next_row(self) -> torch.Tensor:
        if self._rows:
            return self._rows.popleft()
        if not self._is_finished:
            raise RuntimeError("the talker is ahead of the thinker: check is_ready() first")
        if self._is_eos_sent:
            return self._pad
        self._is_eos_sent = True
        return self._eos
