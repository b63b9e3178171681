"""No stream underruns once playback starts, when capacity allows: the conductor's real
`PlaybackBook` ordering audio work, driven by a simulated clock instead of wall time.

The model of a saturated rank: every step takes `STEP_S` simulated seconds and decodes one
chunk of `CHUNK_S` seconds of audio for at most `BATCH` streams, chosen in the order
`PlaybackBook.order` gives (the order the scheduler fills a batch in). Its capacity is
BATCH * CHUNK_S / STEP_S seconds of audio per second, set above the number of streams, so a
good order keeps every client fed; the serving test (test_omni_speech.py) checks the same
server delivers every stream, and `tools/bench.py speech` measures how many streams a real
machine holds in real time.
"""
from __future__ import annotations

import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.playback import PlaybackBook
from runtime.launch.server import REPO
from runtime.conductor.request import Request
from tests.runtime.conductor.test_stream_ledger import plan_of
from runtime.transport.request_params import RequestParams

STREAMS, BATCH = 32, 8
STEP_S, CHUNK_S, CHUNKS = 0.05, 0.25, 24     # capacity 8 * 0.25 / 0.05 = 40 streams in real time
ARRIVAL_GAP_S = 0.02                          # 32 requests arrive over 0.64 s


class SimClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def simulate(order_by_deadline: bool) -> tuple[PlaybackBook, dict[int, float]]:
    """Run the model to the end; the book (underruns) and each stream's wait for first audio."""
    plan = plan_of("qwen3_omni")
    clock = SimClock()
    book = PlaybackBook(plan, first_audio_target_s=1.0, now=clock)
    rate = next(iter(book.rates.values()))
    audio_key = next(iter(book.rates))
    task = next(iter(book.audio_tasks))
    pending = [Request(rid, task, RequestParams(), [], [], arrival=clock.t + rid * ARRIVAL_GAP_S) for rid in range(STREAMS)]
    running: list[Request] = []
    left = {r.request_id: CHUNKS for r in pending}
    first_wait: dict[int, float] = {}
    while pending or running:
        while pending and pending[0].arrival <= clock.t:
            req = pending.pop(0)
            book.open(req)
            running.append(req)
        ordered = book.order(running) if order_by_deadline else running
        clock.t += STEP_S                     # the batch runs; its chunks leave when it ends
        for req in ordered[:BATCH]:
            book.on_tensors(req, {audio_key: torch.zeros(int(CHUNK_S * rate))})
            first_wait.setdefault(req.request_id, clock.t - req.arrival)
            left[req.request_id] -= 1
        for req in [r for r in running if left[r.request_id] == 0]:
            running.remove(req)
            book.free(req.request_id)
    return book, first_wait


def test_deadline_order_keeps_every_stream_playing_when_capacity_allows() -> None:
    book, first_wait = simulate(order_by_deadline=True)
    assert len(first_wait) == STREAMS
    assert book.num_underruns == 0
    assert max(first_wait.values()) <= book.first_audio_target_s


def test_the_model_tells_a_bad_order_apart() -> None:
    """Without the book's order (requests in arrival order), the same load leaves late
    arrivals waiting far past the first-audio target: the model can fail."""
    book, first_wait = simulate(order_by_deadline=False)
    assert max(first_wait.values()) > 2 * book.first_audio_target_s


def test_a_composed_plans_speaking_tasks_keep_playback_clocks() -> None:
    """An included model's audio node is `<include>.<node>`: its tasks are found (Orpheus' speech, Qwen3-Omni's
    voice chat), its silent ones not."""
    plan = compile_file(str(REPO / "graphs" / "voice_agent.yaml"), Options(preset="tiny")).plan
    book = PlaybackBook(plan)
    assert book.audio_tasks == {"asr.voice_chat", "tts.speech"}
    assert book.rates == {"asr.code2wav.audio": 24000, "tts.snac.audio": 24000}
