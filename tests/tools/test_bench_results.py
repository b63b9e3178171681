"""The result JSON schema: rows, records, writing and finding the newest run per suite."""
from __future__ import annotations

import json

import pytest

from bench.results import Row, RunRecord, Side, latest, machine_info, write
from bench.stats import HIGHER, LOWER


def _row(**kw) -> Row:
    base = dict(case="H=4", metric="rollout time", unit="s", better=LOWER, a=Side("cached", [1.0, 2.0, 1.5]),
                b=Side("native", [3.0, 3.0, 6.0]), anchor=2.08, plot="time", x=4, note="n")
    return Row(**{**base, **kw})


def test_row_json_carries_samples_summaries_and_paired_ratios():
    d = _row().to_dict()
    assert d["a"]["median"] == 1.5 and d["b"]["max"] == 6.0
    assert d["ratios"] == [3.0, 1.5, 4.0]
    assert d["ratio"]["median"] == 3.0
    assert Row.from_dict(json.loads(json.dumps(d))) == _row()


def test_measurement_only_row_has_no_ratio():
    d = _row(b=None, better=HIGHER).to_dict()
    assert d["b"] is None and d["ratios"] == [] and d["ratio"] is None
    with pytest.raises(ValueError, match="better"):
        Row.from_dict({**d, "better": "faster"})


def test_write_then_latest_returns_the_newest_record_of_each_suite(tmp_path):
    old = RunRecord("rollout", "t", "cmd", 3, "2026-01-01T00:00:00+00:00", rows=[_row()])
    new = RunRecord("rollout", "t", "cmd2", 3, "2026-01-02T00:00:00+00:00", rows=[_row(case="H=15")],
                    needs=[{"case": "x", "needs": "y"}])
    other = RunRecord("sched", "s", "cmd", 1, "2026-01-01T00:00:00+00:00")
    for r in (new, old, other):
        write(r, tmp_path)
    got = latest(tmp_path, ["chat", "rollout", "sched"])
    assert [r.suite for r in got] == ["rollout", "sched"]
    assert got[0].command == "cmd2" and got[0].rows[0].case == "H=15" and got[0].needs == new.needs
    assert json.loads(next(tmp_path.glob("sched-*.json")).read_text())["schema"] == 1


def test_other_schema_versions_are_refused():
    d = RunRecord("rollout", "t", "c", 1, "2026").to_dict()
    with pytest.raises(ValueError, match="schema"):
        RunRecord.from_dict({**d, "schema": 99})


def test_machine_info_names_cores_and_load(tmp_path):
    info = machine_info(tmp_path)
    assert info["cores"] >= 1 and len(info["loadavg"]) == 3 and info["python"].count(".") == 2
