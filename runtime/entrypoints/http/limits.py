"""What a request may ask of the served model, checked before it is admitted (HTTP 400).

The bounds come from the plan: the vocabulary of the LM that reads a request's token ids
(ids and `top_k` must stay below it), and the longest context it can hold — the smaller of
its maximum positions (`max_position_embeddings`) and its KV pool — which prompt plus
`max_tokens` must fit. JSON bodies are parsed strictly: NaN and Infinity (which Python's
json accepts, and which compare false against every bound) are refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Sequence

from mstar_compiler.plan import Plan
from runtime.entrypoints.http.errors import ApiError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on what one request or session may hold, each the default of the graph's param of that name
    where the graph declares one (`params: max_tools: {type: integer, default: 32, ...}`), else the value here."""

    max_tools: int = 128                    # `tools` of a chat or a realtime session (OpenAI's limit)
    max_schema_bytes: int = 64 * 1024       # a tool's parameters or a response_format schema, as JSON
    max_conversation_items: int = 256       # items of one realtime session's conversation


def serve_limits(plan: Plan) -> ServeLimits:
    declared = {p.name: p.default for p in plan.params}
    return ServeLimits(**{f.name: int(declared[f.name]) for f in fields(ServeLimits) if f.name in declared})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def strict_json(raw: bytes) -> Any:
    """The parsed body; ApiError(400) if it is not JSON or holds NaN / Infinity."""
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON ({exc})") from None


def vocab_size(plan: Plan, node: str | None) -> int | None:
    """Token ids `node` can embed (None: the node does not say)."""
    if node is None:
        return None
    size = plan.node(node).dims.get("vocab_size")
    return None if size is None else int(size)


def max_context(plan: Plan, node: str | None, *, kv_pool: bool = True) -> tuple[int, str] | None:
    """(the longest context `node` holds, what bounds it): its positions, and its KV pool unless
    `kv_pool` is False (the native task endpoint leaves the pool to the conductor's admission)."""
    if node is None:
        return None
    spec = plan.node(node)
    limits = [(int(spec.dims["max_position_embeddings"]), "this model's context")] \
        if "max_position_embeddings" in spec.dims else []
    if kv_pool:
        limits += [(p.num_blocks * p.block_tokens, f"the KV cache of rank {p.rank}") for p in spec.kv_pools]
    return min(limits, default=None)


def check_token_ids(ids: Sequence[int], vocab: int | None, field: str) -> None:
    bad = next((t for t in ids if vocab is not None and t >= vocab), None)
    if bad is not None:
        raise ApiError(400, f"{field}: token id {bad} is outside the model's vocabulary (ids < {vocab})", field)


def check_context(num_prompt: int, max_tokens: int, limit: tuple[int, str] | None) -> None:
    """Prompt + max_tokens within the model's context, else 400 context_length_exceeded."""
    if limit is None:
        return
    tokens, what = limit
    if num_prompt >= tokens:
        raise ApiError(400, f"the prompt has {num_prompt} tokens; {what} holds {tokens} tokens",
                       "messages", "context_length_exceeded")
    if num_prompt + max_tokens > tokens:
        raise ApiError(400, f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds {what} "
                       f"({tokens} tokens); lower max_tokens to at most {tokens - num_prompt}",
                       "max_tokens", "context_length_exceeded")


def check_top_k(top_k: int | None, vocab: int | None) -> None:
    if top_k is not None and vocab is not None and top_k > vocab:
        raise ApiError(400, f"top_k: must be at most the vocabulary size ({vocab}), got {top_k}", "top_k")


def check_roles(messages: list[dict]) -> None:
    for i, m in enumerate(messages):
        if m["role"] not in CHAT_ROLES:
            raise ApiError(400, f"messages[{i}].role: must be one of {', '.join(CHAT_ROLES)}, got {m['role']!r}",
                           f"messages[{i}].role")
