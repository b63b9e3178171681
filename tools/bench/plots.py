"""PNG figures of a result record (matplotlib, headless): one figure per `Row.plot` key.

Numeric x (horizon, concurrency, batch) draws lines with min–max error bars for mstar
and the baseline; categorical x (p50/p95, placement) draws grouped bars.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from bench.results import Row, RunRecord, Side
from bench.stats import summarize


def _groups(rows: Sequence[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        if row.plot is not None:
            groups.setdefault(row.plot, []).append(row)
    return groups


def _series(rows: Sequence[Row], pick: str) -> tuple[str, list[float], list[list[float]]]:
    """(legend label, medians, [below, above] error lengths) of side `pick` ('a' or 'b') across rows."""
    i = 0 if pick == "a" else 1
    sides: list[Side] = [getattr(r, pick) for r in rows]
    stats = [summarize(s.samples) for s in sides]
    medians = [s.median for s in stats]
    same = len({(r.names[i], s.label) for r, s in zip(rows, sides)}) == 1
    label = f"{rows[0].names[i]}: {sides[0].label}" if same else ("A" if i == 0 else "B") + " (see x labels)"
    return label, medians, [[m - s.min for m, s in zip(medians, stats)], [s.max - m for m, s in zip(medians, stats)]]


def _draw(ax, rows: Sequence[Row]) -> None:
    picks = ["a"] + (["b"] if all(r.b is not None for r in rows) else [])
    numeric = all(isinstance(r.x, (int, float)) for r in rows)
    width = 0.8 / len(picks)
    for i, pick in enumerate(picks):
        label, medians, err = _series(rows, pick)
        if numeric:
            ax.errorbar([r.x for r in rows], medians, yerr=err, marker="o", capsize=3, label=label)
        else:
            xs = [j + (i - (len(picks) - 1) / 2) * width for j in range(len(rows))]
            ax.bar(xs, medians, width, yerr=err, capsize=3, label=label)
    if not numeric:
        ax.set_xticks(range(len(rows)), [str(r.x) for r in rows])


def plot_record(record: RunRecord, out_dir: Path) -> list[Path]:
    """Write <out_dir>/<suite>-<plot>.png for each figure of `record`; return their paths."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in _groups(record.rows).items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        _draw(ax, rows)
        ax.set_title(f"{record.suite}: {name}", fontsize=10)
        ax.set_ylabel(f"{rows[0].metric} ({rows[0].unit})")
        ax.set_xlabel(rows[0].xlabel or "")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{record.suite}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
