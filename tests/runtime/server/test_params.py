"""Request params: the graph's declarations checked in one place; OpenAI's field aliases read once."""
from __future__ import annotations

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.server.errors import ApiError
from runtime.server.params import openai_field, resolve_params
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
