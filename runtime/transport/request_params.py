"""`RequestParams`: one request's params as one typed value, resolved once by the server.

The server builds it (runtime/entrypoints/http/params.py: the body's fields checked against the plan's
declarations, defaults taken from the graph file only) and hands it to the conductor, which
reads its loop counts from it and sends it once to every rank of the request in
`OpenRequest`; executors read the typed fields. It travels as msgpack (msgspec), never pickle.

Generic fields are typed here (`sampling`); a model's own params are `declared`: every param
the graph declares, by name, each value of the type and within the bounds the graph gives it.
Nothing here names a model.
"""
from __future__ import annotations

from typing import Union

import msgspec

from runtime.model_executor.sampling.params import SamplingParams

Scalar = Union[int, float, str, bool]


class RequestParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """A request's resolved params (built by `runtime.entrypoints.http.params.resolve_params`)."""

    # every param the graph declares -> the request's value (checked against the declaration's type,
    # bounds and choices) or the declaration's default; a plan's `$name` (loop counts, node args) reads it
    declared: dict[str, Scalar] = {}
    # how the request's LM turns logits into tokens; fields the graph declares (temperature, top_p)
    # hold the declared value, the others the body's value or SamplingParams' neutral default
    sampling: SamplingParams = SamplingParams()
    # values a family's serving code sets for its own executors, never body fields taken unchecked
    # (an image request's output size, the voice a speech request speaks in)
    family: dict[str, Scalar] = {}
    # node -> the llguidance grammar its sampled tokens must follow (response_format, a forced tool call);
    # the server sets it for the node that writes the answer, checked (runtime.model_executor.sampling.grammar)
    grammars: dict[str, str] = {}

    @property
    def max_tokens(self) -> int | None:
        """The request's token budget, None when the graph declares no `max_tokens`."""
        value = self.declared.get("max_tokens")
        return None if value is None else int(value)

    def count(self, name: str) -> int:
        """The integer param `name` (a loop count, a horizon); KeyError naming it when undeclared."""
        try:
            return int(self.declared[name])     # asked per request per step (horizons, token budgets)
        except KeyError:
            raise self._undeclared(name) from None

    def number(self, name: str) -> float:
        """The number param `name` (a scale, a shift); KeyError naming it when undeclared."""
        try:
            return float(self.declared[name])
        except KeyError:
            raise self._undeclared(name) from None

    def under(self, scope: str) -> RequestParams:
        """A request of include `scope`'s model (its own param names) as its plan names them:
        `<scope>.<name>` (mstar_compiler/plan_view.py); "" leaves them as they are."""
        if not scope:
            return self
        return msgspec.structs.replace(self, declared={f"{scope}.{k}": v for k, v in self.declared.items()})

    def within(self, scope: str) -> RequestParams:
        """What the executor of a node of include `scope` reads: the params of its own graph under their own
        names too (`end_of_speech` beside `tts.end_of_speech`); "" leaves them as they are."""
        if not scope:
            return self
        head = scope + "."
        own = {k[len(head):]: v for k, v in self.declared.items() if k.startswith(head)}
        return msgspec.structs.replace(self, declared={**self.declared, **own}) if own else self

    def _undeclared(self, name: str) -> KeyError:
        return KeyError(f"the request has no param '{name}'; the graph declares: {', '.join(self.declared)}")
