"""TextOutput: the text a client receives, with stop tokens and stop strings applied."""
from __future__ import annotations

from runtime.model_executor.sampling import SamplingParams
from runtime.text import TextOutput, TextTokenizer


def _run(tok: TextTokenizer, params: SamplingParams, text_ids: list[int]) -> tuple[str, object, int]:
    """Push ids until the stream finishes; returns (client text, stop reason, tokens consumed)."""
    stream, out = TextOutput(tok, params), []
    for n, token in enumerate(text_ids, start=1):
        delta = stream.push(token)
        out.append(delta.text)
        if delta.finished:
            return "".join(out), delta.stop_reason, n
    return "".join(out) + stream.finish(), None, len(text_ids)


def test_stop_string_across_tokens_is_trimmed(smollm2_tokenizer: TextTokenizer) -> None:
    ids = smollm2_tokenizer.encode("The answer is 42.\nUser: more 😀")
    text, reason, used = _run(smollm2_tokenizer, SamplingParams(stop=("\nUser:",)), ids)
    assert text == "The answer is 42."
    assert reason == "\nUser:"
    assert used < len(ids)


def test_eos_ends_without_its_text_and_releases_held_text(smollm2_tokenizer: TextTokenizer) -> None:
    ids = smollm2_tokenizer.encode("Paris <") + [smollm2_tokenizer.eos_token_id] + smollm2_tokenizer.encode("x")
    text, reason, used = _run(smollm2_tokenizer, SamplingParams(stop=("<stop>",)), ids)
    assert (text, reason) == ("Paris <", 2)        # "<" was held as a possible stop-string start
    assert used == len(ids) - 1


def test_ignore_eos_and_extra_stop_token_ids(smollm2_tokenizer: TextTokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode("a") + [tok.eos_token_id] + tok.encode("b c")
    text, reason, _ = _run(tok, SamplingParams(ignore_eos=True), ids)
    assert (text, reason) == ("ab c", None)
    stop_id = tok.encode(" c")[0]
    text, reason, _ = _run(tok, SamplingParams(ignore_eos=True, stop_token_ids=(stop_id,)), ids)
    assert (text, reason) == ("ab", stop_id)


def test_finish_releases_partial_stop_string(smollm2_tokenizer: TextTokenizer) -> None:
    stream = TextOutput(smollm2_tokenizer, SamplingParams(stop=("ENDING",)))
    pushed = "".join(stream.push(t).text for t in smollm2_tokenizer.encode("go END"))
    assert pushed == "go "
    assert stream.finish() == "END"
    assert stream.finished
