"""The component catalogue: what the compiler knows about each component kind.

Torch-free on purpose: `mstarc compile` and `mstarc lint` read this module and never
import torch. The runtime implements the same kinds (`runtime.model_executor.components`);
`tests/runtime/models/test_registry_matches_catalogue.py` checks that the two cannot drift
(ports, flags, and parameter counts of the tiny presets against real modules).

A model family is declared once, as a `Family`: its kinds, and the "module:attr" names of its
component classes, executor factories and serving hooks, which only the runtime imports. Each
built-in family is the `FAMILY` of one module of this package (`decoder_lm.py`, `bagel.py`, ...,
listed in BUILTIN_FAMILIES); a separately installed package adds a family through the entry-point
group ``mstar.families``, each entry point loading to a `Family`. `load_families()` reads both;
the catalogue, the component classes, the executors and the server's family hooks all come from it.

Shapes of ports are tuples of axis names. An axis is either
  * an upper-case symbol for a dynamic axis, e.g. "T" (tokens), "F" (frames), "B";
  * a lower-case key of the node's preset dims, e.g. "hidden_size", resolved at
    compile time to an int, so an edge from a 1152-wide encoder into a 3584-wide
    LM port is a type error;
  * an int.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any, Callable, Iterable, Mapping

Dims = Mapping[str, Any]

# Port dtypes. One word, one meaning, from YAML to kernel.
PORT_DTYPES = (
    "tokens",     # int64 token ids, shape (T,)
    "text",       # a UTF-8 string (prompt text, detokenised output)
    "hidden",     # float hidden states / embeddings, shape (T, D)
    "image",      # float pixels in [-1, 1], shape (3, H, W)
    "latent",     # float image latents, shape (C, h, w)
    "velocity",   # float flow-matching velocity, same shape as the latent it moves
    "audio",      # float waveform samples in [-1, 1], shape (S,)
    "codes",      # int64 audio codec codes, shape (F, Q) or (T,)
    "video",      # float frames, shape (F, 3, H, W)
    "actions",    # float action/state vectors, shape (F, action_dim)
    "scalar",     # a float or int per request (timestep, score)
)

# Family modules shipped with mstar; each declares its FAMILY.
BUILTIN_FAMILIES = (
    "decoder_lm",
    "bagel",
    "qwen3_omni",
    "orpheus",
    "vjepa2",
    "silero_vad",
    "whisper",
    "zimage",
    "pi05",
)


@dataclass(frozen=True)
class Port:
    """One typed input or output of a component kind."""

    name: str                      # port name as written in YAML: `node.port`
    dtype: str                     # one of PORT_DTYPES
    shape: tuple[str | int, ...]   # axis names (see module docstring)
    stream: bool = False           # input: may be the end of a streaming edge; output: emits items one by one
    optional: bool = False         # input: may be left unconnected
    chunk: str = ""                # stream input: a dims key its chunks must hold exactly (a Fixed policy of
                                   # that size), for kinds that compute on whole windows (an audio encoder)


@dataclass(frozen=True)
class Linear:
    """`count` weights of `n` output by `k` input features that a node of the kind may keep quantized
    (mstar_compiler.quant); `splits_input`: under tensor parallelism each rank holds k / tp of the inputs
    (a row-parallel linear), else n / tp of the outputs."""

    n: int
    k: int
    count: int = 1
    splits_input: bool = False


@dataclass(frozen=True)
class KindSpec:
    """Everything the compiler needs about one component kind, without torch."""

    kind: str                                   # the YAML `kind:` string = its `Family.components` key
    doc: str                                    # one line: what it is
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    presets: Mapping[str, Dims]                 # preset name -> dims; every kind has "tiny"
    num_params: Callable[[Dims], int]           # exact parameter count of the runtime module for these dims
    has_kv_cache: bool = False                  # keeps a per-request KV cache (paged)
    can_batch: bool = True                      # several requests can run in one call
    is_capture_safe: bool = False               # static shapes per batch bucket: CUDA-graph capturable
    # bytes of KV cache one token occupies (all layers, K and V) at `dtype_bytes` per element
    kv_bytes_per_token: Callable[[Dims, int], int] | None = None
    # dims keys that a tensor-parallel size must divide (e.g. num_attention_heads)
    tp_divides: tuple[str, ...] = ()
    # args the kind accepts in YAML `args:` with their default values
    args: Mapping[str, Any] = field(default_factory=dict)
    # the runtime executor a node of this kind gets unless its graph names another (`executor:`);
    # "" = the generic one: "decoder_lm" for kinds with a KV cache, "stateless" otherwise
    executor: str = ""
    # a streaming consumer's first Run waits for this many chunks (Qwen3-Omni's talker starts
    # from two thinker chunks: the text and the first hidden states); later Runs take one
    first_run_chunks: int = 1
    # the name of the `Family` that declares the kind; set by the catalogue from that family
    family: str = ""
    # the dims key counting the kind's repeated layers (a graph preset's `layers:` declares fewer); a kind
    # without it in its dims has no layer count to declare
    layer_dim: str = "num_hidden_layers"
    # the linears a graph's `quant:` quantizes (its decoder layers' attention, MLP and expert weights),
    # mirroring the runtime module exactly; None: the kind cannot be quantized
    quant_linears: Callable[[Dims], list[Linear]] | None = None

    @property
    def default_executor(self) -> str:
        return self.executor or ("decoder_lm" if self.has_kv_cache else "stateless")

    def port(self, name: str, *, output: bool) -> Port | None:
        ports = self.outputs if output else self.inputs
        return next((p for p in ports if p.name == name), None)


class Catalogue:
    """All known kinds: the built-in families plus installed plugins."""

    def __init__(self, specs: Iterable[KindSpec]) -> None:
        self._specs: dict[str, KindSpec] = {}
        for spec in specs:
            if spec.kind in self._specs:
                raise ValueError(f"component kind {spec.kind!r} is defined twice")
            if "tiny" not in spec.presets:
                raise ValueError(f"component kind {spec.kind!r} has no 'tiny' preset")
            for p in (*spec.inputs, *spec.outputs):
                if p.dtype not in PORT_DTYPES:
                    raise ValueError(f"{spec.kind}.{p.name}: unknown port dtype {p.dtype!r}")
            self._specs[spec.kind] = spec

    def __contains__(self, kind: str) -> bool:
        return kind in self._specs

    def __getitem__(self, kind: str) -> KindSpec:
        return self._specs[kind]

    def kinds(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[KindSpec]:
        return [self._specs[k] for k in self.kinds()]


@dataclass(frozen=True)
class Family:
    """One model family: everything mstar learns of it, in one declaration (module docstring).

    The runtime parts are "module:attr" references (`load_ref`), so declaring a family imports
    neither torch nor the runtime; each part is imported when a plan first uses it.
    """

    name: str                           # "bagel"; a built-in's runtime lives in runtime/models/<name>/
    kinds: tuple[KindSpec, ...]         # the component kinds it defines
    components: Mapping[str, str]       # kind -> "module:Class" implementing it, for every kind of `kinds`
    # executor name (what a plan's `Node.executor` names) -> "module:factory", the factory called as
    # factory(plan, node, module, rank) (runtime/worker/executors/registry.py)
    executors: Mapping[str, str] = field(default_factory=dict)
    # "module:attr" of its `FamilyServing` (runtime/entrypoints/http/families.py); "" = the generic server's
    serving: str = ""
    # executor name -> "module:factory" of the KV rows its Runs write, for a KV node whose Runs' tokens do not
    # say them (the Qwen3-Omni talker reads its prompt from a stream; BAGEL's LM lays out text and pictures):
    # factory(plan, node) gives rule(KVRun) -> KVRows (runtime/model_executor/kv/run_rows.py), what the
    # conductor grows and keys the request's table by
    kv_rows: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kinds = {spec.kind for spec in self.kinds}
        unimplemented, foreign = sorted(kinds - set(self.components)), sorted(set(self.components) - kinds)
        if unimplemented or foreign:
            raise ValueError(f"family {self.name!r}: every kind it defines needs one component class"
                             + (f"; no class for {', '.join(unimplemented)}" if unimplemented else "")
                             + (f"; classes for kinds it does not define: {', '.join(foreign)}" if foreign else ""))


FAMILIES_GROUP = "mstar.families"       # the entry-point group of plugin families


def load_ref(ref: str) -> Any:
    """The object a "module:attr" reference of a `Family` names (imports its module)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _builtin_families() -> list[Family]:
    return [importlib.import_module(f"{__name__}.{name}").FAMILY for name in BUILTIN_FAMILIES]


def _plugin_families() -> list[Family]:
    families = []
    for ep in entry_points(group=FAMILIES_GROUP):
        family = ep.load()
        if not isinstance(family, Family):
            raise TypeError(f"entry point {ep.name} = {ep.value} of group {FAMILIES_GROUP} is a "
                            f"{type(family).__name__}, not a mstar_compiler.catalogue.Family")
        families.append(family)
    return families


_FAMILIES: dict[str, Family] | None = None
_CATALOGUE: Catalogue | None = None


def load_families() -> dict[str, Family]:
    """Every model family mstar knows, by name: the built-ins, then installed plugins (cached)."""
    global _FAMILIES
    if _FAMILIES is None:
        families: dict[str, Family] = {}
        for family in [*_builtin_families(), *_plugin_families()]:
            if family.name in families:
                raise ValueError(f"model family {family.name!r} is declared twice (a built-in or an installed "
                                 f"plugin's entry point in group {FAMILIES_GROUP})")
            families[family.name] = family
        _FAMILIES = families
    return _FAMILIES


def load_catalogue() -> Catalogue:
    """The catalogue of every kind mstar knows: those of every family, built-in or plugin (cached)."""
    global _CATALOGUE
    if _CATALOGUE is None:
        _CATALOGUE = Catalogue(replace(spec, family=family.name)
                               for family in load_families().values() for spec in family.kinds)
    return _CATALOGUE
