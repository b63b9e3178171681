"""Orpheus token ids -> SNAC's three code levels, as Orpheus's own decoder lays them out."""
from __future__ import annotations

import torch

from runtime.models.orpheus.codes import codes_to_tokens, tokens_to_codes
from tests.runtime.models.orpheus.snac_reference import CODEBOOK, OFFSET


def orpheus_redistribute(ids: list[int]) -> list[list[int]]:
    """Orpheus's `redistribute_codes`, restated from its published decoder loop."""
    codes = [t - OFFSET for t in ids]
    l1, l2, l3 = [], [], []
    for i in range(len(codes) // 7):
        l1.append(codes[7 * i])
        l2.append(codes[7 * i + 1] - 4096)
        l3.append(codes[7 * i + 2] - 2 * 4096)
        l3.append(codes[7 * i + 3] - 3 * 4096)
        l2.append(codes[7 * i + 4] - 4 * 4096)
        l3.append(codes[7 * i + 5] - 5 * 4096)
        l3.append(codes[7 * i + 6] - 6 * 4096)
    return [l1, l2, l3]


def test_levels_match_orpheus_layout():
    torch.manual_seed(0)
    frames = torch.randint(0, CODEBOOK, (5, 7))
    ids = (frames + OFFSET + CODEBOOK * torch.arange(7)).flatten()  # a valid 5-frame stream
    levels, valid = tokens_to_codes(ids[None], OFFSET, CODEBOOK)
    assert bool(valid[0])
    assert [lv[0].tolist() for lv in levels] == orpheus_redistribute(ids.tolist())
    assert [lv.shape[1] for lv in levels] == [5, 10, 20]


def test_round_trip():
    torch.manual_seed(1)
    levels = [torch.randint(0, CODEBOOK, (3, 4 * k)) for k in (1, 2, 4)]
    back, valid = tokens_to_codes(codes_to_tokens(levels, OFFSET, CODEBOOK), OFFSET, CODEBOOK)
    assert valid.all()
    assert all(torch.equal(a, b) for a, b in zip(levels, back))


def test_token_of_the_wrong_position_invalidates_its_window():
    torch.manual_seed(2)
    levels = [torch.randint(0, CODEBOOK, (3, 4 * k)) for k in (1, 2, 4)]
    ids = codes_to_tokens(levels, OFFSET, CODEBOOK)
    ids[1, 3] -= CODEBOOK          # a position-2 code placed at position 3
    ids[2, 27] = 128258            # end-of-speech inside the window
    levels_out, valid = tokens_to_codes(ids, OFFSET, CODEBOOK)
    assert valid.tolist() == [True, False, False]
    assert all(int(lv.min()) >= 0 and int(lv.max()) < CODEBOOK for lv in levels_out)
