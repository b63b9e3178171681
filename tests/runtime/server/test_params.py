"""Request params: resolved in one place into one typed `RequestParams` (defaults from the graph only,
bounds and unknown fields -> 400 naming the field) that crosses the wire typed; OpenAI's aliases read once."""
from __future__ import annotations

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.params import openai_field, resolve_params
from runtime.transport.messages import OpenRequest, decode, encode
from tests.runtime.serving.conftest import REPO


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(REPO / "graphs" / "smollm2.yaml"), Options(preset="tiny")).plan


def test_max_completion_tokens_is_openais_name_for_max_tokens() -> None:
    assert openai_field({"max_completion_tokens": 7, "max_tokens": 9}, "max_tokens") == 7
    assert openai_field({"max_tokens": 9}, "max_tokens") == 9
    assert openai_field({"max_completion_tokens": None, "max_tokens": 9}, "max_tokens") == 9
    assert openai_field({}, "temperature") is None


def test_defaults_come_from_the_graph_and_bounds_are_checked(plan) -> None:
    declared = {p.name: p for p in plan.params}
    params = resolve_params(plan, {})
    assert params.declared == {name: p.default for name, p in declared.items()}
    spec = declared["max_tokens"]
    with pytest.raises(ApiError, match="max_tokens"):
        resolve_params(plan, {"max_tokens": spec.maximum + 1})
    with pytest.raises(ApiError, match="must be of type integer"):
        resolve_params(plan, {"max_tokens": "12"})


@pytest.fixture(scope="module")
def bagel_plan():
    return compile_file(str(REPO / "graphs" / "bagel.yaml"), Options(preset="tiny")).plan


def test_every_declared_param_is_typed_as_its_declaration(bagel_plan) -> None:
    """Defaults are the graph's, numbers are floats even when given as integers, integers stay ints."""
    params = resolve_params(bagel_plan, {"steps": 7, "timestep_shift": 2})
    assert params.declared["steps"] == 7 and type(params.declared["steps"]) is int
    assert params.declared["timestep_shift"] == 2.0 and type(params.declared["timestep_shift"]) is float
    defaults = {p.name: p.default for p in bagel_plan.params}
    assert params.declared["cfg_text_scale"] == defaults["cfg_text_scale"]
    assert all(type(v) is float for k, v in params.declared.items()
               if next(p for p in bagel_plan.params if p.name == k).type == "number")
    assert params.count("steps") == 7 and params.number("timestep_shift") == 2.0


def test_declared_sampling_fields_default_from_the_graph_not_the_sampler(plan) -> None:
    """smollm2.yaml declares temperature 0 (greedy); SamplingParams alone would sample at 1."""
    assert resolve_params(plan, {}).sampling.temperature == 0.0
    params = resolve_params(plan, {"temperature": 0.5, "top_k": 4, "seed": 3, "max_tokens": 9})
    assert (params.sampling.temperature, params.sampling.top_k, params.sampling.seed) == (0.5, 4, 3)
    assert params.max_tokens == 9 and params.declared["temperature"] == 0.5


def test_unknown_and_invalid_fields_are_400_naming_the_field(plan) -> None:
    for given, field in (({"steps": 4}, "steps"), ({"top_k": -5}, "top_k"), ({"seed": "x"}, "seed"),
                         ({"temperature": 2.5}, "temperature"), ({"max_tokens": 0}, "max_tokens")):
        with pytest.raises(ApiError) as err:
            resolve_params(plan, given)
        assert err.value.status == 400 and err.value.param == field, (given, err.value.message)
    assert resolve_params(plan, {"steps": None}).declared == resolve_params(plan, {}).declared   # None: not given


def test_request_params_cross_the_wire_typed(bagel_plan) -> None:
    params = resolve_params(bagel_plan, {"steps": 5, "seed": 11}, {"width": 64, "height": 32})
    back = decode(encode(OpenRequest(request_id=1, params=params)))
    assert back.params == params
    assert type(back.params.declared["timestep_shift"]) is float and back.params.sampling.seed == 11
    assert back.params.family == {"width": 64, "height": 32}
