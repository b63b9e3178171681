"""Suite registry: each comparison is a `Suite` registered by its module `bench/suite_<name>.py`.

A suite's `run(ctx)` measures with `ctx.alternate(...)` and returns `Row`s; a part it
needs that is not in the tree (yet) is reported by raising or recording `Needs`, never
by a made-up number.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from tqdm import tqdm

from bench import quiet
from bench.abab import Measure, Samples, alternate, round_order
from bench.results import Row

# the order, then ours
SUITE_ORDER = ("chat", "rollout", "cfg", "tts", "stack", "sched", "linear", "kernels", "speech", "prefix", "bound",
               "bound-3b", "threads", "network", "realtime", "prefill", "attention", "quant", "orpheus-3b", "vjepa2-g",
               "omni-wide", "bagel-wide", "structured", "cascade", "whisper", "dit", "pi05")


class Needs(Exception):
    """A comparison cannot run: the message names what is missing and how to get it."""


@dataclass
class Context:
    """What a suite run gets: knobs from the command line and a place for its settings."""

    rounds: int                          # recorded ABBA rounds per comparison
    quick: bool                          # smaller cases (CI smoke, a noisy machine)
    root: Path                           # repository root
    threads: int | None = None           # torch threads of in-process sides (None: torch's default)
    vllm: Path | None = None             # the vLLM peer's bin/vllm, bin/python or venv (None: .bench/vllm-venv)
    llamacpp: Path | None = None         # the llama.cpp peer: a llama-server binary or the xllamacpp venv (None:
                                         # .bench/'s native build if there, else .bench/llamacpp-venv)
    cpu_compile: bool = False            # mstar's SmolLM2 plans with `args: {cpu_compile: true}` on the lm node
    dtypes: tuple[str, ...] = ("float32", "bfloat16")   # the dtypes a suite comparing several runs (chat)
    settle_s: float = quiet.TIMEOUT_S    # before each run, wait up to this long for a quiet machine (0: no wait)
    settle_waits: list[float] = field(default_factory=list)  # seconds each of those waits took
    settings: dict[str, Any] = field(default_factory=dict)   # recorded in the result JSON
    needs: list[dict[str, str]] = field(default_factory=list)  # comparisons that could not run

    @property
    def bench_dir(self) -> Path:
        """Where tools/setup_*.sh put the peers' venvs and weights."""
        return self.root / ".bench"

    def alternate(self, label: str, sides: Mapping[str, Measure], warmup: int = 1) -> Samples:
        """`abab.alternate` with a progress bar named `label`; the side order of each round is recorded in the
        settings (`side_order`)."""
        self.settings.setdefault("side_order", {})[label] = [round_order(list(sides), i) for i in range(self.rounds)]
        with tqdm(total=self.rounds * len(sides), desc=label, unit="run", leave=False) as bar:
            return alternate(sides, self.rounds, warmup, lambda done, side: bar.update(1), self._settle)

    def _settle(self) -> None:
        if self.settle_s > 0:
            self.settle_waits.append(quiet.wait_quiet(self.settle_s))

    def record_needs(self, case: str, exc: Needs) -> None:
        self.needs.append({"case": case, "needs": str(exc)})


@dataclass(frozen=True)
class Suite:
    """One comparison of the issue: its name, a title naming both sides, and its runner."""

    name: str
    title: str
    run: Callable[[Context], list[Row]]


_SUITES: dict[str, Suite] = {}


def register(name: str, title: str) -> Callable[[Callable[[Context], list[Row]]], Callable[[Context], list[Row]]]:
    """Decorator for a suite's run function."""

    def deco(fn: Callable[[Context], list[Row]]) -> Callable[[Context], list[Row]]:
        if name in _SUITES:
            raise ValueError(f"benchmark suite {name!r} is registered twice")
        _SUITES[name] = Suite(name, title, fn)
        return fn

    return deco


def suites() -> dict[str, Suite]:
    """Every suite, in the issue's order (imports the suite modules on first use)."""
    for name in SUITE_ORDER:
        importlib.import_module(f"bench.suite_{name.replace('-', '_')}")
    return {name: _SUITES[name] for name in SUITE_ORDER if name in _SUITES}
