"""Markdown table and PNG plots rendered from result records."""
from __future__ import annotations

import pytest

from bench.plots import plot_record
from bench.report import fmt, render, row_line
from bench.results import Row, RunRecord, Side
from bench.stats import LOWER


def _record() -> RunRecord:
    rows = [Row(f"H={h}", "rollout time", "s", LOWER, Side("cached", [h * 0.1, h * 0.12]),
                Side("native", [h * 0.5, h * 0.3]), 2.08, "time-vs-horizon", h, xlabel="H") for h in (4, 15)]
    rows.append(Row("16 streams", "p50 E2E", "s", LOWER, Side("mstar", [2.0, 2.2]), Side("vllm", [1.0, 1.1]),
                    plot="latency", x="p50"))
    rows.append(Row("64 live", "time per step", "ms", LOWER, Side("conductor", [0.3, 0.4])))
    return RunRecord("rollout", "title", "python tools/bench.py rollout", 2, "2026-01-01T00:00:00+00:00",
                     machine={"cpu": "cpu", "cores": 2, "loadavg": [3.5, 1, 1], "commit": "abc"}, rows=rows,
                     needs=[{"case": "ac-24", "needs": "more memory"}])


def test_row_line_shows_medians_ranges_ratio_and_verdict():
    line = row_line(_record().rows[0])
    # mstar 0.40 then 0.48, native 2.0 then 1.2: per-round ratios 5.0 and 2.5
    assert "0.440 [0.400–0.480]" in line and "1.60 [1.20–2.00]" in line
    assert "3.75× (2.50–5.00)" in line and "2.08×" in line and "mstar ahead" in line


def test_table_says_plainly_when_mstar_is_behind_and_what_did_not_run():
    text = render([_record()])
    assert "mstar behind" in text and "vllm ahead" not in text and "baseline ahead" in text
    assert "measurement only" in text
    assert "not measured: ac-24: more memory" in text
    assert "`python tools/bench.py rollout`" in text and "load average at start 3.5" in text
    assert "- mstar: cached" in text and "- baseline: native" in text


def test_suites_measured_on_different_machines_each_name_their_own():
    import dataclasses
    xeon, epyc = _record(), dataclasses.replace(_record(), suite="structured", machine={"cpu": "AMD EPYC", "cores": 2})
    one = render([xeon, dataclasses.replace(xeon, suite="cfg")])
    assert one.count("Machine: cpu, 2 cores") == 1                     # one machine: said once, at the top
    both = render([xeon, epyc])
    assert "measured on different machines" in both
    sections = both.split("### ")[1:]
    assert "Machine: cpu, 2 cores" in sections[0] and "Machine: AMD EPYC, 2 cores" in sections[1]


def test_fmt_keeps_three_significant_digits():
    assert [fmt(x) for x in (0, 1234.5, 12.345, 1.0, 0.0123, 0.00001)] == ["0", "1234", "12.3", "1.00", "0.0123",
                                                                         "1.00e-05"]


def test_plots_write_one_png_per_figure(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the `bench` extra")
    paths = plot_record(_record(), tmp_path)
    assert sorted(p.name for p in paths) == ["rollout-latency.png", "rollout-time-vs-horizon.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_plot_legend_names_a_side_only_when_it_is_the_same_on_every_bar():
    from bench.plots import _series
    rows = [Row("fp32", "p50 E2E", "s", LOWER, Side("mstar-run", [1.0]), Side(label, [2.0]), names=("mstar", name),
                plot="p50", x=f"mstar vs {name}") for name, label in (("vllm", "vLLM"), ("hf", "HF generate"))]
    assert _series(rows, "a")[0] == "mstar: mstar-run"
    assert _series(rows, "b")[0] == "B (see x labels)"
    assert _series(rows, "b")[1:] == ([2.0, 2.0], [[0.0, 0.0], [0.0, 0.0]])


def test_publish_keeps_the_newest_json_per_suite_and_writes_the_table_between_the_markers(tmp_path):
    from bench.report import TABLE_BEGIN, TABLE_END, publish
    from bench.results import write
    out, docs = tmp_path / "bench-results", tmp_path / "docs"
    docs.mkdir()
    (docs / "benchmarks.md").write_text(f"# Benchmarks\n\nmethod\n\n{TABLE_BEGIN}\nold table\n{TABLE_END}\n\nafter\n")
    older = write(_record(), out)
    (docs / "bench-results").mkdir()
    (docs / "bench-results" / older.name.replace("20260101", "20250101")).write_text("{}")  # a stale copy
    record = _record()
    record.started = "2026-02-01T00:00:00+00:00"
    newer = write(record, out)
    copied = publish([newer], docs)
    assert [p.name for p in copied] == [newer.name]
    assert sorted(p.name for p in (docs / "bench-results").iterdir()) == [newer.name]   # the stale one went
    page = (docs / "benchmarks.md").read_text()
    assert page.startswith("# Benchmarks\n\nmethod\n\n") and page.endswith(f"{TABLE_END}\n\nafter\n")
    assert "old table" not in page and "3.75× (2.50–5.00)" in page and "2026-02-01" in page
    (docs / "benchmarks.md").write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        publish([newer], docs)


def test_a_suite_s_files_are_not_those_of_a_suite_its_name_begins(tmp_path) -> None:
    """`bound` and `bound-3b` both write `bound-...json`: each suite's newest file is its own."""
    from bench.results import latest_paths, suite_files
    for name in ("bound-20261206T071359Z", "bound-3b-20261206T084544Z", "bound-3b-20261205T010101Z", "bound-x.json"):
        (tmp_path / f"{name}.json").write_text("{}")
    assert [p.name for p in suite_files(tmp_path, "bound")] == ["bound-20261206T071359Z.json"]
    assert [p.name for p in latest_paths(tmp_path, ["bound", "bound-3b"])] == [
        "bound-20261206T071359Z.json", "bound-3b-20261206T084544Z.json"]
