"""`mstarc` from the command line: compile, lint (CI formats), explain, graph; no torch."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from compiler_helpers import HERE, REPO
from mstar_compiler.cli import main
from mstar_compiler.plan import load_plan

MSTARC = [sys.executable, "-m", "mstar_compiler.cli"]
INVALID = HERE / "invalid" / "unknown_node_in_walk.yaml"


def test_compile_and_lint_do_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from mstar_compiler.cli import main\n"
        f"assert main(['lint', {str(REPO / 'graphs')!r}]) == 0\n"
        f"assert main(['compile', {str(REPO / 'graphs' / 'bagel.yaml')!r}, '-o', {str(tmp_path / 'b.bin')!r}]) == 0\n"
        f"assert main(['explain', {str(tmp_path / 'b.bin')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_lint_of_the_seed_graphs_through_the_console_script():
    """Lint's speed on any machine comes from never importing torch
    (test_compile_and_lint_do_not_import_torch), so no wall-clock bound here."""
    exe = shutil.which("mstarc", path=str(REPO / ".venv" / "bin")) or shutil.which("mstarc")
    cmd = [exe] if exe else MSTARC
    done = subprocess.run([*cmd, "lint", "graphs/"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9/9 graph file(s) ok" in done.stderr


def test_lint_reports_errors_with_exit_status_and_github_annotations(capsys):
    assert main(["lint", str(INVALID), str(REPO / "graphs" / "smollm2.yaml")]) == 1
    out = capsys.readouterr()
    assert f"{INVALID}:" in out.out and "1/2 graph file(s) ok" in out.err
    assert main(["lint", "--format", "github", str(INVALID)]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"::error file={INVALID},line=") and ",col=" in line and "did you mean" in line


def test_compile_writes_plan_and_stages(tmp_path, capsys):
    out, stages = tmp_path / "o.bin", tmp_path / "stages"
    rc = main(["compile", str(REPO / "graphs" / "orpheus.yaml"), "-o", str(out), "--placement", "tp2",
               "--devices", "2", "--device-memory", "512MiB", "--dump-stages", str(stages)])
    assert rc == 0 and out.read_bytes()[:8] == b"MSTARPLN"
    assert len(list(stages.iterdir())) == 10
    assert main(["explain", str(out)]) == 0
    report = capsys.readouterr().out
    assert "placement tp2" in report and "tp=2" in report and "budget 512.0 MiB" in report


def test_command_line_mistakes_are_compile_errors(tmp_path, capsys):
    graph = str(REPO / "graphs" / "bagel.yaml")
    assert main(["compile", graph, "-o", str(tmp_path / "x"), "--preset", "bagel7b"]) == 1
    assert "did you mean 'bagel-7b'?" in capsys.readouterr().err
    assert main(["compile", graph, "-o", str(tmp_path / "x"), "--placement", "cfg_parallel", "--devices", "2"]) == 1
    assert "placement rank 2 out of range" in capsys.readouterr().err
    assert main(["compile", graph, "-o", str(tmp_path / "x"), "--device-memory", "lots"]) == 1
    assert "not a size" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "x")]) == 1
    assert "cannot read graph file" in capsys.readouterr().err


def test_explain_refuses_a_corrupt_plan(tmp_path, capsys):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"MSTARPLN" + b"\x01\x00\x00\x00" + b"\x00" * 40)
    assert main(["explain", str(bad)]) == 1
    assert "checksum mismatch" in capsys.readouterr().err


def test_graph_dot_and_svg(capsys, tmp_path):
    assert main(["graph", str(REPO / "graphs" / "bagel.yaml"), "--placement", "cfg_parallel"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "bagel-7b-mot"') and "cluster_rank2" in dot and '"cfg" -> "vae_dec"' in dot
    rc = main(["graph", str(REPO / "graphs" / "orpheus.yaml"), "--format", "svg", "-o", str(tmp_path / "g.svg")])
    if shutil.which("dot"):
        assert rc == 0 and "<svg" in (tmp_path / "g.svg").read_text()
    else:
        assert rc == 1 and "Graphviz" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["compile"], ["nonsense"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_quant_on_the_command_line_quantizes_over_the_graph_and_names_its_mistakes(tmp_path, capsys):
    """`mstarc compile --quant NODE=SCHEME` wins over the graph's `quant:`; explain shows the quantized bytes."""
    graph, out = str(REPO / "graphs" / "smollm2.yaml"), str(tmp_path / "p.bin")
    sizes = {}
    for scheme in ("none", "int8", "int4_g32"):
        assert main(["compile", graph, "--preset", "smollm2-135m-q4", "--quant", f"lm={scheme}", "-o", out]) == 0
        capsys.readouterr()
        plan = load_plan(out)
        assert plan.node("lm").quant == ("" if scheme == "none" else scheme)
        sizes[scheme] = plan.ranks[0].weight_bytes
        assert main(["explain", out]) == 0
        assert (f"linears {scheme}" in capsys.readouterr().out) == (scheme != "none")
    # SmolLM2: 106M of its 135M parameters in the linears, fp32 -> int8 / int4 with their scales
    assert sizes["none"] > sizes["int8"] > sizes["int4_g32"]
    assert main(["compile", graph, "--quant", "ml=int8", "-o", out]) == 1
    assert "--quant ml=int8: the graph has no node 'ml' to quantize" in capsys.readouterr().err
    assert main(["compile", graph, "--quant", "lm=int3", "-o", out]) == 1
    assert "--quant lm=int3: give NODE=SCHEME, SCHEME one of int8, int4_g32, none" in capsys.readouterr().err
