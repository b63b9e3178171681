"""The names the conductor gives a media item's placeholder rows (runtime/conductor/media_keys.py): equal
items name their rows alike; any byte of the pixels, the grid or the kind names them apart; text keeps its
ids; an item of several media names each as it is named alone."""
from __future__ import annotations

import hashlib

import torch

from runtime.conductor.media_keys import media_names, media_rows, run_rows
from runtime.conductor.request import MediaInput
from runtime.models.qwen3_omni.vision_inputs import VisualGrid, VisualInput

PAD, START, END = 7, 5, 6


def _picture(seed: int = 0, grid: VisualGrid = VisualGrid(1, 4, 4, 0)) -> VisualInput:
    pixels = torch.randint(0, 255, (16, 12), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return VisualInput(pixels.float(), [START, PAD, PAD, PAD, PAD, END], grid)


def test_equal_items_name_their_pads_alike_and_each_pad_apart() -> None:
    a, b = _picture(), _picture()
    rows = run_rows(a.tokens, a, frozenset({PAD}))
    assert rows == run_rows(b.tokens, b, frozenset({PAD}))
    assert rows[0] == START and rows[-1] == END                # markers keep their ids
    pads = rows[1:-1]
    assert len(set(pads)) == 4 and all(isinstance(r, bytes) and len(r) == 24 for r in pads)
    assert all(r[:4] == b"\xff" * 4 for r in pads)              # int32 -1 first: no token id is negative
    # the index follows the pad's place among the item's pads (an oracle of the layout, written out)
    ((digest, _),) = media_names(a)
    assert pads[2] == b"\xff" * 4 + digest + (2).to_bytes(4, "little")


def media_digest(item: MediaInput) -> bytes:
    ((digest, _),) = media_names(item)
    return digest


def test_a_pixel_the_grid_or_the_kind_names_the_rows_apart() -> None:
    base = media_digest(_picture())
    touched = _picture()
    touched.value[3, 4] += 1.0
    assert media_digest(touched) != base
    assert media_digest(_picture(grid=VisualGrid(2, 4, 4, 0))) != base           # a video's frames: other rows
    plain = _picture()
    assert media_digest(MediaInput(plain.value, plain.tokens)) != base          # an audio item of the same bytes
    # the digest covers the tensor's dtype and shape too, not only its bytes
    assert media_digest(MediaInput(plain.value.view(12, 16), plain.tokens)) != media_digest(
        MediaInput(plain.value, plain.tokens))
    assert len(base) == 16 and base != hashlib.blake2b(b"", digest_size=16).digest()


def test_a_recompute_of_a_longer_history_keeps_its_ids() -> None:
    a = _picture()
    history = [1, 2, *a.tokens, 3]
    assert run_rows(history, a, frozenset({PAD})) == history     # its pads then stop the keying (stop ids)
    assert run_rows(a.tokens, None, frozenset({PAD})) == a.tokens
    assert media_rows([PAD, 9, PAD], frozenset({PAD}), [(b"\x01" * 16, -1)])[1] == 9


def test_a_history_of_utterances_names_each_as_the_turn_before_did() -> None:
    """A realtime conversation's history is one item of every utterance's rows: the earlier utterances'
    pads are named as in the turn before (one utterance fewer), so that turn's blocks are found again."""
    first, second = torch.randn(3, 4), torch.randn(2, 4)
    ids = frozenset({PAD})
    turn1 = MediaInput(first.clone(), [1, PAD, PAD, PAD, 2], parts=(3,))
    turn2 = MediaInput(torch.cat([first, second]), [1, PAD, PAD, PAD, 2, 1, PAD, PAD, 2], parts=(3, 2))
    rows1, rows2 = run_rows(turn1.tokens, turn1, ids), run_rows(turn2.tokens, turn2, ids)
    assert rows2[:5] == rows1
    alone = MediaInput(second.clone(), [PAD, PAD], parts=(2,))
    assert [r for r in rows2[5:] if isinstance(r, bytes)] == list(run_rows(alone.tokens, alone, ids))
    assert rows2[6][-4:] == (0).to_bytes(4, "little")          # each utterance's pads counted from 0
    whole = MediaInput(turn2.value, turn2.tokens)               # named as one medium, the first pads differ
    assert run_rows(whole.tokens, whole, ids)[1] != rows2[1]
