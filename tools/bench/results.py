"""The result JSON: one file per suite run under bench-results/, and the facts of the machine.

Schema (version 1), every number in the unit its row names:
  {"schema": 1, "suite": str, "title": str,
   "command": str,            # the exact command line that made it
   "started": iso8601, "finished": iso8601, "rounds": int,
   "machine": {...},          # machine_info(): cpu, cores, memory, load average, versions
   "settings": {...},         # suite-specific knobs (presets, lengths, concurrency); side_order: each
                              # comparison's sides per round (ABBA); the served suites add sides (each
                              # side's label, cache mode and settings as it reports them: threads, binding,
                              # kernel ISA, preloads, KV budget) and cache_states (case -> side -> one
                              # state a round: bench.cache_state)
   "rows": [Row.to_dict()],   # measured comparisons
   "needs": [{"case": str, "needs": str}]}   # comparisons that could not run, and why
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from bench.stats import HIGHER, LOWER, Summary, round_ratios, summarize

SCHEMA_VERSION = 1


@dataclass
class Side:
    """One measured system: an honest label and its per-round samples."""

    label: str
    samples: list[float]

    def summary(self) -> Summary:
        return summarize(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "samples": self.samples, **self.summary().to_dict()}


@dataclass
class Row:
    """One comparison of one metric in one case: mstar (a) against a baseline (b, optional)."""

    case: str                    # e.g. "ac-mid H=15"
    metric: str                  # e.g. "rollout time"
    unit: str                    # e.g. "s", "tok/s"
    better: str                  # stats.LOWER or stats.HIGHER
    a: Side                      # the mstar side
    b: Side | None = None        # the baseline; None for a plain measurement (sched)
    anchor: float | None = None  # the paper's ratio for this comparison, if any
    plot: str | None = None      # figure this row belongs to
    x: float | str | None = None  # its x value on that figure (horizon, concurrency, percentile)
    note: str = ""
    xlabel: str | None = None    # what x is (figure axis label)
    names: tuple[str, str] = ("mstar", "baseline")  # short names of a and b (peer-only rows differ)

    def ratios(self) -> list[float]:
        """Per-round advantage of a over b (> 1: mstar ahead); empty without a baseline."""
        return [] if self.b is None else round_ratios(self.a.samples, self.b.samples, self.better)

    def to_dict(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {"case": self.case, "metric": self.metric, "unit": self.unit, "better": self.better,
                "a": self.a.to_dict(), "b": None if self.b is None else self.b.to_dict(),
                "ratios": ratios, "ratio": summarize(ratios).to_dict() if ratios else None,
                "anchor": self.anchor, "plot": self.plot, "x": self.x, "note": self.note,
                "xlabel": self.xlabel, "names": list(self.names)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        b = None if d["b"] is None else Side(d["b"]["label"], d["b"]["samples"])
        if d["better"] not in (LOWER, HIGHER):
            raise ValueError(f"row {d['case']!r}: better must be lower or higher, got {d['better']!r}")
        return cls(d["case"], d["metric"], d["unit"], d["better"], Side(d["a"]["label"], d["a"]["samples"]),
                   b, d["anchor"], d["plot"], d["x"], d.get("note", ""), d.get("xlabel"),
                   tuple(d.get("names", ("mstar", "baseline"))))


@dataclass
class RunRecord:
    """Everything one suite run produced; `write` turns it into the JSON above."""

    suite: str
    title: str
    command: str
    rounds: int
    started: str
    finished: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    needs: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "suite": self.suite, "title": self.title, "command": self.command,
                "started": self.started, "finished": self.finished, "rounds": self.rounds,
                "machine": self.machine, "settings": self.settings,
                "rows": [r.to_dict() for r in self.rows], "needs": self.needs}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"result schema {d.get('schema')!r} is not {SCHEMA_VERSION}")
        return cls(d["suite"], d["title"], d["command"], d["rounds"], d["started"], d["finished"],
                   d["machine"], d["settings"], [Row.from_dict(r) for r in d["rows"]], d["needs"])


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write(record: RunRecord, out_dir: Path) -> Path:
    """Write `record` as <out_dir>/<suite>-<started>.json and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = record.started.replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"{record.suite}-{stamp}.json"
    path.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    return path


def suite_files(out_dir: Path, suite: str) -> list[Path]:
    """`suite`'s result files under `out_dir` (`<suite>-<time>.json`), oldest first: `bound`'s are not `bound-3b`'s."""
    return sorted(p for p in out_dir.glob(f"{suite}-*.json") if re.fullmatch(r"\d{8}T\d{6}Z", p.stem[len(suite) + 1:]))


def latest_paths(out_dir: Path, suites: Sequence[str]) -> list[Path]:
    """The newest result file of each suite in `suites` found under `out_dir`, in that order."""
    return [paths[-1] for suite in suites if (paths := suite_files(out_dir, suite))]


def latest(out_dir: Path, suites: Sequence[str]) -> list[RunRecord]:
    """The newest record of each suite in `suites` found under `out_dir`, in that order."""
    return [RunRecord.from_dict(json.loads(path.read_text())) for path in latest_paths(out_dir, suites)]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float | None:
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        return round(kib / 2**20, 1)
    except (OSError, IndexError, ValueError):
        return None


def _git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info(root: Path) -> dict[str, Any]:
    """CPU, cores, memory, load average (how busy the machine was), Python/torch versions, commit."""
    try:
        import torch
        torch_version, threads = torch.__version__, torch.get_num_threads()
    except ImportError:
        torch_version, threads = None, None
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "mem_gib": _mem_gib(),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "torch": torch_version, "torch_threads": threads, "platform": platform.platform(),
            "commit": _git_commit(root)}
