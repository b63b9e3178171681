"""The decode-step profile table printed by tools/profile_decode.py (mstar) and tools/profile_vllm.py (vLLM)."""
from __future__ import annotations


def table(rows: dict[int, dict[str, float]], categories: tuple[str, ...], column: str = "batch") -> str:
    """Markdown: one row per category, one column per batch (ms per step and share), then tok/s
    (`column` "tokens": one prefill of that many tokens per column)."""
    batches = sorted(rows)
    head = "| category | " + " | ".join(f"{column} {b}" for b in batches) + " |"
    lines = [head, "|" + " --- |" * (len(batches) + 1)]
    for cat in (*categories, "step"):
        cells = [f"{rows[b][cat]:.2f} ms ({100 * rows[b][cat] / rows[b]['step']:.0f} %)" for b in batches]
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    lines.append("| tok/s | " + " | ".join(f"{b * 1e3 / rows[b]['step']:.0f}" for b in batches) + " |")
    return "\n".join(lines)
