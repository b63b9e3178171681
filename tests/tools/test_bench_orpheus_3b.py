"""The orpheus-3b suite's parts that run without its 13 GB of weights and its peers: the client's token -> code
mapping and windows (checked against mstar's own Orpheus code mapping), its stream decoding with a real small
SNAC, the peers' request and event shapes, the checkpoint's layout against the published one, the weights that
make a random LM speak audio tokens, and the rows."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from bench import orpheus_3b_weights as weights
from bench.orpheus_client import AUDIO_OFFSET, CODEBOOK, SnacClient, _Stream, chunk_tokens, request, to_code, \
    window_levels
from bench.registry import Context
from bench.speech_load import SAMPLE_RATE, SpeechBurst, StreamResult
from bench.suite_orpheus_3b import CONCURRENCY, METRICS, SERVER_METRICS, Prompts, Served, _rows, burst_metrics
from runtime.models.orpheus.codes import tokens_to_codes
from tests.runtime.weights.published_layouts import repository


def test_an_audio_token_of_its_slot_maps_to_its_code_and_any_other_token_folds() -> None:
    assert to_code(AUDIO_OFFSET + 5, 0) == (5, False)
    assert to_code(AUDIO_OFFSET + 3 * CODEBOOK + 17, 3) == (17, False)
    assert to_code(AUDIO_OFFSET + 3 * CODEBOOK + 17, 4) == ((AUDIO_OFFSET + 3 * CODEBOOK + 17) % CODEBOOK, True)
    assert to_code(42, 1) == (42, True)                     # a text token
    assert to_code(AUDIO_OFFSET + 7 * CODEBOOK + 1, 0)[1]   # past the last slot


def test_the_clients_window_levels_are_mstars_levels_of_the_same_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, CODEBOOK, (28,), generator=g).tolist()
    tokens = torch.tensor([[AUDIO_OFFSET + CODEBOOK * (i % 7) + c for i, c in enumerate(codes)]])
    levels, valid = tokens_to_codes(tokens, AUDIO_OFFSET, CODEBOOK)
    assert bool(valid[0]) and window_levels(codes) == [level[0].tolist() for level in levels]
    with pytest.raises(ValueError, match="whole frames"):
        window_levels(codes[:-1])


@pytest.fixture(scope="module")
def small_snac(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SNAC with the 24 kHz model's rates (2048 samples a frame), written as the suite writes the real one."""
    from safetensors.torch import save_file
    from snac import SNAC

    config = {**weights.SNAC_24KHZ, "encoder_dim": 8, "decoder_dim": 32}
    out = tmp_path_factory.mktemp("snac")
    torch.manual_seed(0)
    save_file(SNAC(**config).state_dict(), str(out / "pytorch_model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_a_stream_decodes_a_window_every_7_tokens_from_the_28th_in_order(small_snac: Path) -> None:
    snac = SnacClient(small_snac)

    async def play() -> _Stream:
        stream = _Stream(snac, 0.0)
        for piece in ([AUDIO_OFFSET] * 20, [7] * 15, [AUDIO_OFFSET + CODEBOOK] * 14):   # 49 tokens in 3 pieces
            stream.take(piece)
        await asyncio.gather(*stream.pending)
        return stream

    stream = asyncio.run(play())
    assert len(stream.codes) == 49 and len(stream.arrivals) == 4      # windows ending at 28, 35, 42, 49
    assert stream.samples == [2048] * 4 and stream.arrivals == sorted(stream.arrivals)
    # 15 text tokens 7 fold; of 14 tokens AUDIO_OFFSET + 4096, those at slot 1 (positions 36, 43) map as audio
    assert stream.folded == 20 - 3 + 15 + 14 - 2


def test_each_peer_is_asked_for_token_ids_with_the_same_sampling() -> None:
    sampling = {"temperature": 0.6, "top_p": 0.8}
    path, body = request("vllm", [1, 2], 112, "orpheus-3b", 3, sampling)
    assert path == "/v1/completions" and body["prompt"] == [1, 2] and body["max_tokens"] == 112
    assert body["return_token_ids"] and body["ignore_eos"] and body["stream"] and body["temperature"] == 0.6
    path, body = request("llamacpp", [1, 2], 112, "orpheus-3b", 3, sampling)
    assert path == "/completion" and body["n_predict"] == 112 and body["return_tokens"] and body["ignore_eos"]
    assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["cache_prompt"] is False and body["top_p"] == 0.8
    with pytest.raises(ValueError, match="unknown server"):
        request("sglang", [1], 1, "m", 0, sampling)
    assert chunk_tokens("vllm", {"choices": [{"text": "", "token_ids": [5, 6]}]}) == [5, 6]
    assert chunk_tokens("vllm", {"choices": [{"text": ""}]}) == []
    assert chunk_tokens("llamacpp", {"content": "", "tokens": [9], "stop": False}) == [9]


def test_the_suites_checkpoint_has_the_published_names_and_shapes() -> None:
    published = {name: tuple(shape) for file in repository("orpheus-3b-0.1-ft").values()
                 for name, shape in file.items()}
    published.pop("lm_head.weight", None)          # tied to the embedding; some uploads store a copy
    assert weights._lm_shapes() == published


def test_a_checkpoint_of_another_recipe_is_told_apart(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    stamped, plain = tmp_path / "stamped.safetensors", tmp_path / "plain.safetensors"
    save_file({"w": torch.ones(2)}, str(stamped), metadata={"mstar_bench_recipe": weights.RECIPE})
    save_file({"w": torch.ones(2)}, str(plain), metadata={"format": "pt"})
    assert weights._recipe(stamped) == weights.RECIPE
    assert weights._recipe(plain) is None and weights._recipe(tmp_path / "missing.safetensors") is None


def test_the_random_lm_speaks_audio_tokens() -> None:
    """A small Llama of Orpheus' vocabulary with the suite's random weights: the next token is an audio token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=weights.VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    tensors = {name: (torch.ones_like(p) if p.dim() == 1 else torch.randn(p.shape, generator=g) * 0.02)
               for name, p in model.state_dict().items() if name != "lm_head.weight"}
    weights._speak_audio_tokens(tensors)
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    prompt = torch.tensor([[128259, 100, 200, 300, 128009, 128260, 128261, 128257]])
    with torch.no_grad():
        logits = model(prompt).logits[0] / 0.6
    share = logits.softmax(-1)[:, AUDIO_OFFSET:].sum(-1)
    assert (share > 0.99).all(), share     # not 1: a 256-wide model's margin is smaller than the 3,072-wide one's


def _burst(ttfa: float, wall: float, chunks: int) -> SpeechBurst:
    return SpeechBurst([StreamResult(tuple(ttfa + 0.5 * i for i in range(chunks)), (2048,) * chunks, 112)], wall)


def test_burst_metrics_count_audio_per_wall_second_and_underruns_over_a_tenth() -> None:
    m = burst_metrics(_burst(2.0, 10.0, 4), 1)     # 4 chunks of 85.3 ms, 0.5 s apart: 3 gaps of 0.41 s
    audio = 16 * 2048 / SAMPLE_RATE                # RTF counts what the 112 tokens encode: 16 frames
    assert m["audio_s_1"] == 4 * 2048 / SAMPLE_RATE   # what was delivered
    assert m["ttfa_1"] == 2.0
    assert m["rtf_1"] == pytest.approx(10.0 / audio, rel=1e-12)           # float: a sum and two divisions
    assert m["audio_per_s_1"] == pytest.approx(audio / 10.0, rel=1e-12)   # float: a sum and a division
    assert m["underrun_streams_1"] == 1.0
    assert m["underrun_s_1"] == pytest.approx(3 * (0.5 - 2048 / SAMPLE_RATE), rel=1e-9)  # float sums of 3 gaps
    tight = SpeechBurst([StreamResult((1.0, 1.1, 1.2), (2048,) * 3, 112)], 2.0)   # gaps of 0.015 s: under 0.1
    assert burst_metrics(tight, 1)["underrun_streams_1"] == 0.0


def test_prompts_are_fresh_in_every_burst() -> None:
    prompts = Prompts()
    first, second = prompts.next(16), prompts.next(16)
    assert len(set(first) | set(second)) == 32


def test_rows_compare_mstar_with_each_peer_at_every_concurrency() -> None:
    ctx = Context(rounds=2, quick=False, root=Path("."), settle_s=0)
    samples, sides = {}, {}
    for name in ("mstar", "vllm", "llamacpp"):
        metrics = {"start_s": [10.0, 11.0], "peak_rss_gib": [7.0, 7.0], "cache_query_tokens": [0.0, 0.0],
                   "cache_hit_tokens": [0.0, 0.0]}
        for n in CONCURRENCY:
            metrics.update({f"{k}_{n}": [1.0, 2.0] for k, *_ in METRICS})
            metrics.update({f"audio_s_{n}": [1.2, 1.2], f"folded_{n}": [0.0, 3.0]})
        samples[name] = metrics
        side = Served(ctx, name, lambda stack: None, lambda peer, texts, tokens: None)
        side.record = {"label": name, "cache_enabled": False, "cache_source": "test"}
        sides[name] = side
    rows = _rows(ctx, samples, sides, 112)
    per_pair = len(SERVER_METRICS) + len(CONCURRENCY) * len(METRICS)
    assert len(rows) == 2 * per_pair and not ctx.needs
    assert {r.names for r in rows} == {("mstar", "vllm"), ("mstar", "llamacpp")}
    assert {r.x for r in rows if r.x is not None} == set(CONCURRENCY)
    samples["vllm"]["cache_hit_tokens"] = [0.0, 48.0]           # a side whose cache helped it: refused
    rows = _rows(ctx, samples, sides, 112)
    assert len(rows) == per_pair and ctx.needs and "mstar vs vllm" in ctx.needs[0]["case"]
