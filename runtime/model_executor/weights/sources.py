"""Where each node's weights come from at serve time, and the rule that random weights are never
an accident.

    --weights ROOT        one directory per published repository, named after it: a node whose
                          graph mapping reads `owner/name` reads ROOT/name/
    --weights NAME=DIR    repository NAME (`name` or `owner/name`) is read from DIR instead
    --random-weights      nodes given no weights start from seeded random weights (a preset may
                          say so too: `random_weights: true`, as the tiny ones do, but not for a
                          node that --weights ROOT finds nothing for: that is an error, unless
                          --random-weights is given too)

`resolve(plan, node, options)` says where one node's weights come from, or raises MissingWeights
naming the node, the paths tried and the layout expected. Nodes without a mapping keep the older
rules: ROOT/<node>, ROOT itself for a plan of one weight group, then the preset's path.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mstar_compiler.plan import Node, Plan


@dataclass(frozen=True)
class WeightOptions:
    """`--weights` values as given, and `--random-weights`."""

    values: tuple[str, ...] = ()
    allow_random: bool = False

    @property
    def roots(self) -> list[Path]:
        return [Path(v) for v in self.values if "=" not in v]

    @property
    def overrides(self) -> dict[str, Path]:
        pairs = (v.split("=", 1) for v in self.values if "=" in v)
        return {name.strip(): Path(path) for name, path in pairs}

    def cli_args(self) -> list[str]:
        """The same options for a `mstar-run worker` command line."""
        args = [a for v in self.values for a in ("--weights", v)]
        return args + (["--random-weights"] if self.allow_random else [])


@dataclass(frozen=True)
class NodeWeights:
    """Where one node's weights come from."""

    kind: str                   # "mapped" (a published repository) | "path" | "random" | "none" (no parameters)
    path: str | None = None     # the repository directory, or the file/dir/gguf reference
    seed: int = 0               # random: the seed

    def describe(self) -> str:
        """What the log, /v1/models and /health say."""
        if self.kind == "random":
            return f"seed:{self.seed} (random weights)"
        return self.path or "none"


class MissingWeights(FileNotFoundError):
    """A node that needs weights has none; the message says where mstar looked and what to do."""


def repo_dir_name(source: str) -> str:
    """Directory name of a published repository under ROOT: the part after `owner/`."""
    return source.rsplit("/", 1)[-1]


def resolve(plan: Plan, node: Node, options: WeightOptions) -> NodeWeights:
    """Where `node`'s weights come from under `options` (see module doc)."""
    owner = plan.node(node.weight_key)
    seed = int(owner.args.get("seed", 0))
    if owner.num_params == 0:
        return NodeWeights("none")
    if owner.weight_map is not None:
        found, tried = _repository(owner.weight_map.source, options)
        if found is not None:
            return NodeWeights("mapped", str(found))
        if options.allow_random or owner.random_weights and not tried:
            return NodeWeights("random", seed=seed)
        raise MissingWeights(_missing_repository(owner, tried))
    path = _legacy_path(plan, owner, options)
    if path is not None:
        return NodeWeights("path", path)
    if options.allow_random or owner.random_weights and not options.roots:
        return NodeWeights("random", seed=seed)
    if owner.random_weights:     # --weights ROOT was given for weights, and this node has none there
        tried = "\n".join(f"    {root / owner.weight_key} (not there)" for root in options.roots)
        raise MissingWeights(f"node '{owner.name}' ({owner.kind}, {owner.source}) has no weights under --weights, "
                             f"and preset '{plan.preset}' maps none for it.\n  tried:\n{tried}\n  fix: put them at "
                             f"ROOT/{owner.weight_key}, give the preset a `weights:` mapping, or pass "
                             f"--random-weights to start the nodes without weights from seeded random ones")
    raise MissingWeights(f"node '{owner.name}' ({owner.kind}, {owner.source}) needs weights and the graph preset "
                         f"'{plan.preset}' declares no source for it: give it a `weights:` mapping in the preset, "
                         f"pass --weights DIR with DIR/{owner.name}, or ask for random weights (--random-weights)")


def resolve_all(plan: Plan, options: WeightOptions) -> dict[str, NodeWeights]:
    """node name -> its weights for every node; one MissingWeights naming every node without any."""
    out: dict[str, NodeWeights] = {}
    problems: dict[str, str] = {}
    for node in plan.nodes:
        try:
            out[node.name] = resolve(plan, node, options)
        except MissingWeights as exc:
            problems.setdefault(node.weight_key, str(exc))
    if problems:
        raise MissingWeights(f"{len(problems)} node(s) have no weights: {', '.join(problems)}\n"
                             + "\n".join(problems.values()))
    return out


def _repository(source: str, options: WeightOptions) -> tuple[Path | None, list[Path]]:
    """The directory of repository `source`, and every path tried."""
    name = repo_dir_name(source)
    overrides = options.overrides
    for key in (source, name):
        if key in overrides:
            path = overrides[key]
            return (path if path.is_dir() else None), [path]
    tried = [root / name for root in options.roots]
    return next((p for p in tried if p.is_dir()), None), tried


def _missing_repository(node: Node, tried: list[Path]) -> str:
    assert node.weight_map is not None
    source = node.weight_map.source
    name = repo_dir_name(source)
    where = "\n".join(f"    {p} (no such directory)" for p in tried) or "    nothing: no --weights given"
    return (f"node '{node.name}' ({node.kind}, {node.source}) reads its weights from {source}, which was not found.\n"
            f"  tried:\n{where}\n"
            f"  expected: ROOT/{name}/ as `huggingface-cli download {source} --local-dir ROOT/{name}` leaves it "
            f"(model.safetensors.index.json and its shards, or *.safetensors; config.json), served with "
            f"`--weights ROOT`, or `--weights {name}=DIR` for that repository alone; "
            f"`--random-weights` for seeded random weights instead")


def _legacy_path(plan: Plan, node: Node, options: WeightOptions) -> str | None:
    for root in options.roots:
        if (root / node.weight_key).exists():
            return str(root / node.weight_key)
    roots = options.roots
    if len(roots) == 1 and len({n.weight_key for n in plan.nodes}) == 1:
        return str(roots[0])
    if node.name in options.overrides:
        return str(options.overrides[node.name])
    ref = node.weights or node.args.get("weights")
    return str(ref) if ref else None
