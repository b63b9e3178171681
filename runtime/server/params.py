"""Request params checked against the plan's declarations (type, bounds, choices) -> HTTP 400."""
from __future__ import annotations

import math
from typing import Any, Mapping

from mstar_compiler.plan import Param, Plan
from runtime.server.errors import ApiError

_TYPES = {"integer": (int,), "number": (int, float), "boolean": (bool,), "string": (str,)}


def check_param(spec: Param, value: Any) -> Any:
    """`value` if it satisfies `spec`; raises ApiError(400) naming the field otherwise."""
    ok_types = _TYPES.get(spec.type, (object,))
    if isinstance(value, bool) and spec.type != "boolean" or not isinstance(value, ok_types):
        raise ApiError(400, f"'{spec.name}' must be of type {spec.type}, got {type(value).__name__}", spec.name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"'{spec.name}' must be a finite number, got {value}", spec.name)
    if spec.minimum is not None and value < spec.minimum:
        raise ApiError(400, f"'{spec.name}' must be >= {spec.minimum}, got {value}", spec.name)
    if spec.maximum is not None and value > spec.maximum:
        raise ApiError(400, f"'{spec.name}' must be <= {spec.maximum}, got {value}", spec.name)
    if spec.choices is not None and value not in spec.choices:
        raise ApiError(400, f"'{spec.name}' must be one of {spec.choices}, got {value!r}", spec.name)
    return float(value) if spec.type == "number" else value


def resolve_params(plan: Plan, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared param: the given value (checked) or its default."""
    out: dict[str, Any] = {}
    for spec in plan.params:
        if given.get(spec.name) is not None:
            out[spec.name] = check_param(spec, given[spec.name])
        elif spec.default is None:
            raise ApiError(400, f"'{spec.name}' is required", spec.name)
        else:
            out[spec.name] = spec.default
    return out


# OpenAI's newer spelling of a field -> the plan param it sets (read here, once, for every handler)
OPENAI_ALIASES = {"max_tokens": "max_completion_tokens"}


def openai_field(body: Mapping[str, Any], name: str) -> Any:
    """The body's value for `name`, taking OpenAI's newer alias when the client sent that one."""
    alias = OPENAI_ALIASES.get(name)
    return body[alias] if alias is not None and body.get(alias) is not None else body.get(name)
