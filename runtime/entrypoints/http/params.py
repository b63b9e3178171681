"""A request's params resolved in one place: checked against the plan's declarations -> HTTP 400.

Every handler builds its request's `RequestParams` here, from the fields it takes of the body:
a param the graph declares is checked against its declaration (type, bounds, choices) and
defaults to the graph's value (defaults live only in the graph file); a sampling field the
graph does not declare is checked by `SamplingParams`; any other name is refused (400).
"""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Mapping

from mstar_compiler.plan import Param, Plan
from runtime.model_executor.sampling import SamplingParams, SamplingParamsError
from runtime.entrypoints.http.errors import ApiError
from runtime.transport.request_params import RequestParams, Scalar

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))

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


def resolve_params(plan: Plan, given: Mapping[str, Any], family: Mapping[str, Scalar] | None = None) -> RequestParams:
    """The request's params: every declared param (the given value, checked, or its default), the
    sampling fields, and `family` (what the family's serving code sets). None in `given` = not given."""
    specs = {p.name: p for p in plan.params}
    unknown = next((k for k, v in given.items() if v is not None and k not in specs and k not in SAMPLING_FIELDS), None)
    if unknown is not None:
        raise ApiError(400, f"unknown param '{unknown}'; this model takes {', '.join(specs) or 'no params'} "
                       f"and the sampling fields {', '.join(SAMPLING_FIELDS)}", unknown)
    declared = {name: _declared(spec, given.get(name)) for name, spec in specs.items()}
    sampling = {k: v for k, v in given.items() if k in SAMPLING_FIELDS and k not in specs}
    sampling.update({k: v for k, v in declared.items() if k in SAMPLING_FIELDS})
    return RequestParams(declared, _sampling(sampling), dict(family or {}))


def _declared(spec: Param, value: Any) -> Any:
    if value is not None:
        return check_param(spec, value)
    if spec.default is None:
        raise ApiError(400, f"'{spec.name}' is required", spec.name)
    return float(spec.default) if spec.type == "number" else spec.default   # typed as a given value is


def _sampling(values: Mapping[str, Any]) -> SamplingParams:
    try:
        return SamplingParams.from_mapping(values)
    except SamplingParamsError as exc:
        raise ApiError(400, str(exc), exc.field) from None
    except TypeError as exc:
        raise ApiError(400, str(exc)) from None


# OpenAI's newer spelling of a field -> the plan param it sets (read here, once, for every handler)
OPENAI_ALIASES = {"max_tokens": "max_completion_tokens"}


def openai_field(body: Mapping[str, Any], name: str) -> Any:
    """The body's value for `name`, taking OpenAI's newer alias when the client sent that one."""
    alias = OPENAI_ALIASES.get(name)
    return body[alias] if alias is not None and body.get(alias) is not None else body.get(name)
