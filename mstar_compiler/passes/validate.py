"""Pass 2, validate: the graph against `schemas/walk_graph.schema.json` (JSON Schema 2020-12).

The first (most relevant) schema error becomes a CompileError at the file:line:column of
the offending value, with its YAML path and a hint (did-you-mean for unknown keys).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path as FsPath
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from mstar_compiler.errors import CompileError, did_you_mean
from mstar_compiler.passes.load import Doc

SCHEMA_PATH = FsPath(__file__).resolve().parents[2] / "schemas" / "walk_graph.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


# JSON Schema counts 0.0 as an integer; YAML's `0.0` is a float to every pass after this one (a rank,
# a count, an index), so "integer" here means a YAML integer
_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPES)


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return _Validator(schema())


def run(doc: Doc) -> Doc:
    """Raise a CompileError for the most relevant schema violation; return `doc` unchanged."""
    error = best_match(_validator().iter_errors(doc.data))
    if error is not None:
        raise _to_compile_error(doc, error)
    return doc


def _to_compile_error(doc: Doc, error: ValidationError) -> CompileError:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        return _unknown_key(doc, error, path)
    if "propertyNames" in error.schema_path:
        return doc.error(f"{error.instance!r} is not a valid name", (*path, error.instance),
                         "names are letters, digits and _, not starting with a digit", key=True)
    if error.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", error.message)
        name = missing[0] if missing else error.message
        return doc.error(f"missing required key '{name}'", path, _describe(error.schema) if path else "")
    if error.validator == "pattern" and "port_ref" in str(error.schema_path):
        return doc.error(f"{error.instance!r} is not a `node.port` reference", path)
    if error.validator == "const":
        return doc.error(f"expected {error.validator_value!r}, got {error.instance!r}", path)
    if error.validator == "enum":
        return doc.error(f"{error.instance!r} is not allowed here", path,
                         did_you_mean(error.instance, [str(a) for a in error.validator_value]))
    if error.validator in ("maxProperties", "minProperties") and isinstance(error.instance, dict):
        keys = ", ".join(error.instance) or "none"
        return doc.error(f"wrong number of keys here (has: {keys})", path, _context(error))
    if error.validator == "pattern":
        return doc.error(f"{error.instance!r} is not in the expected form", path, _context(error))
    return doc.error(_short(error), path, _context(error))


def _context(error: ValidationError) -> str:
    """`expected ...` from the nearest schema (this one or an enclosing anyOf) with a description."""
    current: ValidationError | None = error
    while current is not None:
        if current.absolute_path != error.absolute_path:
            break
        hint = _describe(current.schema)
        if hint:
            return hint
        current = current.parent
    return ""


def _unknown_key(doc: Doc, error: ValidationError, path: tuple) -> CompileError:
    allowed = list(error.schema.get("properties", {}))
    extra = [k for k in error.instance if k not in allowed] if isinstance(error.instance, dict) else []
    key = extra[0] if extra else "?"
    return doc.error(f"unknown key '{key}'", (*path, key), did_you_mean(key, allowed), key=True)


def _short(error: ValidationError) -> str:
    message = error.message
    if len(message) > 160:
        message = message[:157] + "..."
    return message


def _describe(sub: Any) -> str:
    if isinstance(sub, dict):
        if "description" in sub:
            return f"expected {sub['description']}"
        ref = sub.get("$ref", "")
        if ref:
            target = schema()["$defs"].get(ref.rsplit("/", 1)[-1], {})
            if "description" in target:
                return f"expected {target['description']}"
    return ""
