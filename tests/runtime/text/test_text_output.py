"""TextOutput: the text a client receives, with stop tokens and stop strings applied."""
from __future__ import annotations

from runtime.model_executor.sampling import SamplingParams
from runtime.text import TextOutput, TextTokenizer, output_text


def _run(tok: TextTokenizer, params: SamplingParams, text_ids: list[int]) -> tuple[str, object, int]:
    """Push ids until the output finishes; returns (client text, stop reason, tokens consumed)."""
    output, out = TextOutput(tok, params), []
    for n, token in enumerate(text_ids, start=1):
        delta = output.push(token)
        out.append(delta.text)
        if delta.finished:
            return "".join(out), delta.stop_reason, n
    return "".join(out) + output.finish(), None, len(text_ids)


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
    output = TextOutput(smollm2_tokenizer, SamplingParams(stop=("ENDING",)))
    pushed = "".join(output.push(t).text for t in smollm2_tokenizer.encode("go END"))
    assert pushed == "go "
    assert output.finish() == "END"
    assert output.finished


def test_output_events_and_a_whole_output_decode_as_the_tokenizer_does(smollm2_tokenizer: TextTokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode("ok 😀 done") + [tok.eos_token_id] + tok.encode("never")
    stops = frozenset({tok.eos_token_id})
    output = TextOutput(tok, SamplingParams(), stop_ids=stops)
    events = [ids[:2], ids[2:3], ids[3:]]           # an event's ids may end inside a character
    text = "".join(output.push_ids(e, is_last=i == len(events) - 1) for i, e in enumerate(events))
    assert text == tok.decode(ids[:ids.index(tok.eos_token_id)]) == "ok 😀 done"   # nothing after the stop
    assert output_text(tok, ids, stops) == text
