"""Markdown rendering of result records: bench-results/latest.md, the table docs/benchmarks.md shows.

One section per suite: the command that made it, when, how loaded the machine was, a
table (mstar, baseline, mstar's advantage as median and range of per-round ratios, the
paper's anchor, a verdict in words), the honest names of both sides, what could not run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from bench.results import Row, RunRecord, suite_files
from bench.stats import summarize, verdict

HEADER = "| case | metric | A (mstar) | B (baseline) | A's advantage | anchor | verdict |"
RULE = "| --- | --- | ---: | ---: | ---: | ---: | --- |"


def fmt(x: float) -> str:
    """Three significant digits, no scientific notation for the usual ranges."""
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:#.3g}" if abs(x) >= 0.001 else f"{x:.2e}"


def fmt_side(samples: Sequence[float]) -> str:
    s = summarize(samples)
    return f"{fmt(s.median)} [{fmt(s.min)}–{fmt(s.max)}]"


def row_line(row: Row) -> str:
    """One table line: medians with [min–max], ratio median (min–max), verdict."""
    metric = f"{row.metric} ({row.unit}, {row.better} is better)"
    if row.b is None:
        return f"| {row.case} | {metric} | {fmt_side(row.a.samples)} | — | — | — | measurement only |"
    r = summarize(row.ratios())
    ratio = f"{r.median:.2f}× ({r.min:.2f}–{r.max:.2f})"
    anchor = "—" if row.anchor is None else f"{row.anchor:g}×"
    return (f"| {row.case} | {metric} | {fmt_side(row.a.samples)} | {fmt_side(row.b.samples)} "
            f"| {ratio} | {anchor} | {verdict(r, row.names)} |")


def _legend(rows: Sequence[Row]) -> list[str]:
    """The honest name of every side, once, and each distinct note."""
    sides = dict.fromkeys((n, s.label) for r in rows for n, s in zip(r.names, (r.a, r.b)) if s is not None)
    notes = dict.fromkeys(f"{r.case}: {r.note}" for r in rows if r.note)
    return [f"- {name}: {label}" for name, label in sides] + [f"- note, {n}" for n in notes]


def suite_section(record: RunRecord, figures: Sequence[str] = (), machine: bool = False) -> str:
    """One suite's heading, command, table and legend (`machine`: its machine line too, when the page's
    suites were not all measured on one machine)."""
    m = record.machine
    lines = [f"### {record.suite}: {record.title}", "",
             f"`{record.command}` — {record.started}, {record.rounds} rounds, "
             f"load average at start {m.get('loadavg', ['?'])[0]}, commit {m.get('commit', '?')}", "",
             *([machine_line(record), ""] if machine else [])]
    if record.rows:
        lines += [HEADER, RULE, *(row_line(r) for r in record.rows), ""]
        lines += _legend(record.rows)
    lines += [f"- not measured: {n['case']}: {n['needs']}" for n in record.needs]
    lines += [f"![{record.suite}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def machine_line(record: RunRecord) -> str:
    m = record.machine
    return (f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('mem_gib')} GiB, "
            f"Python {m.get('python')}, torch {m.get('torch')}, {m.get('platform')}")


def render(records: Sequence[RunRecord], figures: dict[str, list[str]] | None = None) -> str:
    """The whole markdown page for the newest record of each suite."""
    if not records:
        return "No benchmark results yet: run `python tools/bench.py`.\n"
    figures = figures or {}
    one_machine = len({machine_line(r) for r in records}) == 1
    head = ["## Benchmarks", "", machine_line(records[-1]) if one_machine else
            "The suites were measured on different machines: each names its own.", "",
            "Figures are medians over the rounds with [min–max]; each round runs every side, in ABBA order "
            "(A B, then B A), on the same weights and \"A's advantage\" is the median (min–max) of the per-round ratios "
            "(> 1: A ahead; A is mstar unless the case says otherwise). The machine is shared and noisy: read the ranges.", ""]
    return "\n".join(head) + "\n" + "\n".join(suite_section(r, figures.get(r.suite, ()), not one_machine)
                                             for r in records)


TABLE_BEGIN = "<!-- the table: written by `python tools/bench.py --publish` from docs/bench-results/; not by hand -->"
TABLE_END = "<!-- end of the table -->"


def publish(paths: Sequence[Path], docs: Path) -> list[Path]:
    """Copy the result files `paths` into docs/bench-results/ (replacing that suite's older file) and write
    their table between the markers of docs/benchmarks.md. Returns the copied files."""
    kept = docs / "bench-results"
    kept.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in paths:
        suite = path.name.rsplit("-", 1)[0]
        for old in suite_files(kept, suite):
            if old.name != path.name:
                old.unlink()
        copied.append(Path(shutil.copyfile(path, kept / path.name)))
    records = [RunRecord.from_dict(json.loads(p.read_text())) for p in copied]
    page = docs / "benchmarks.md"
    text = page.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"{page} lacks the table's markers ({TABLE_BEGIN!r} ... {TABLE_END!r})")
    head, rest = text.split(TABLE_BEGIN, 1)
    tail = rest.split(TABLE_END, 1)[1]
    page.write_text(f"{head}{TABLE_BEGIN}\n\n{render(records)}\n{TABLE_END}{tail}")
    return copied
