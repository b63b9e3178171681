"""How often a repeated event is worth a log line: a flood of dropped messages or refused peers
must not flood the log too."""
from __future__ import annotations


def is_worth_logging(count: int) -> bool:
    """Log the 1st..10th occurrence, then every 1000th."""
    return count <= 10 or count % 1000 == 0
