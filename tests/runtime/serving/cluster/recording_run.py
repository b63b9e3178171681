"""`mstar-run` whose Ray actors write down what Ray handed them: every call's arguments and keygen's answer.

    python tests/runtime/serving/cluster/recording_run.py RECORD_DIR PLAN --ray HEAD ...   # mstar-run's flags

Run as a script, so Ray ships the recording actor class by value (this file is no module the
nodes can import); it records, then does exactly what the real RankActor does. One msgpack file
per call, `<pid>-<call>.msgpack`: {"args": [...], "result": ..., "key_path": ...}, where
`args` are the call's arguments as Ray delivered them (RankLaunch as a map).
"""
from __future__ import annotations

import os
import sys
from typing import Any

import msgspec

import runtime.ranks.ray.ray_launcher as ray_launcher
from runtime.entrypoints.cli import main
from runtime.ranks.ray.rank_actor import RankActor

RECORD_DIR = sys.argv[1]


def _record(actor: RankActor, call: str, args: tuple[Any, ...], result: Any = None) -> None:
    entry = {"args": list(args), "result": result, "key_path": actor.key_path}
    with open(os.path.join(RECORD_DIR, f"{os.getpid()}-{call}.msgpack"), "wb") as f:
        f.write(msgspec.msgpack.encode(entry))


class RecordingRankActor(RankActor):
    def keygen(self, *args: Any) -> bytes:
        public = super().keygen(*args)
        _record(self, "keygen", args, public)
        return public

    def run(self, *args: Any) -> int:
        _record(self, "run", args)
        return super().run(*args)


if __name__ == "__main__":
    ray_launcher.RankActor = RecordingRankActor    # the launcher makes its actors of this class
    sys.exit(main(sys.argv[2:]))
