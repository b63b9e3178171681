"""SamplingParams checks itself: every bad field is a SamplingParamsError naming it."""
from __future__ import annotations

import pytest

from runtime.model_executor.sampling import SamplingParams, SamplingParamsError


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", 2.5), ("temperature", float("nan")), ("temperature", "hot"),
    ("top_k", -2), ("top_k", 1.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.01), ("min_p", -0.1), ("min_p", 1.5),
    ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
    ("seed", 1.0), ("seed", 2**64), ("stop", ("",)), ("stop", ("ok", 3)), ("stop", tuple("x" * 17)),
    ("stop_token_ids", (-1,)), ("stop_token_ids", ("2",)), ("ignore_eos", 1),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 2.0),
])
def test_invalid_value_names_its_field(field: str, value: object) -> None:
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field
    assert field in str(err.value)


def test_valid_edges_are_accepted_and_normalised() -> None:
    p = SamplingParams(temperature=0, top_k=-1, top_p=1, min_p=1, repetition_penalty=0.5,
                       presence_penalty=-2, frequency_penalty=2, seed=-5, stop="END", logprobs=20)
    assert p.is_greedy and p.effective_top_k == 0
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)
    assert p.stop == ("END",)
    assert p.has_penalties
    assert not SamplingParams().has_penalties


def test_from_mapping_rejects_unknown_fields_and_skips_none() -> None:
    p = SamplingParams.from_mapping({"temperature": 0.5, "seed": None, "stop": ["a", "b"]})
    assert p.temperature == 0.5 and p.seed is None and p.stop == ("a", "b")
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams.from_mapping({"temprature": 0.5})
    assert err.value.field == "temprature"


def test_params_are_immutable() -> None:
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 0.3  # type: ignore[misc]
