"""Make `tools/` importable: Meta's side of the parity tests is the benchmark's (bench.vjepa2_meta)."""
from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[4] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
