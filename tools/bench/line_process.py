"""A peer run as a child process that answers one JSON line for each JSON line it reads (bench.omni_hf,
bench.bagel_peer): started with the suite's side, its stderr in a log, stopped by closing its stdin."""
from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

from bench.registry import Needs


class LineProcess:
    def __init__(self, stack: contextlib.ExitStack, cmd: Sequence[str], log_path: Path, what: str,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("w")
        stack.callback(log.close)
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env=None if env is None else dict(env), cwd=cwd)
        stack.callback(self.stop)
        self.what, self.log_path, self.pid = what, log_path, self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)

    def ask(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send `request` (None: only read, e.g. the ready line) and return the process's next line, parsed."""
        if request is not None:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise Needs(f"{self.what} ended (rc {self.proc.wait()}): see {self.log_path}")
        return json.loads(line)
