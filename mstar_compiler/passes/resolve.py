"""Pass 3, resolve (part 1): graph preset, params, nodes (kinds, presets, dims, args, same_as).

Walks, edges, streams, tasks and the placement choice are resolved in `resolve_walks`,
which this pass calls last.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan, quant
from mstar_compiler.errors import CompileError, Path, did_you_mean
from mstar_compiler.ir import IR, NodeIR, ParamIR
from mstar_compiler.passes import include, resolve_walks, weight_map
from mstar_compiler.passes.resolve_walks import param_ref
from mstar_compiler.units import parse_size

DEFAULT_DEVICE_MEMORY = 80 * 2**30
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_MAX_BATCH = 64
_PY_TYPES = {"integer": (int,), "number": (int, float), "boolean": (bool,), "string": (str,)}


def run(ir: IR) -> IR:
    data = ir.doc.data
    ir.model = data["model"]
    preset = _choose_preset(ir)
    include.run(ir, preset, run)
    ir.device_memory = _device_memory(ir, preset)
    _params(ir, preset)
    _nodes(ir, preset)
    resolve_walks.run(ir)
    return ir


def _choose_preset(ir: IR) -> dict[str, Any]:
    presets = ir.doc.data.get("presets", {})
    name = ir.options.preset
    path: Path = ("presets",)
    if name is None and "default_preset" in ir.doc.data:
        name, path = ir.doc.data["default_preset"], ("default_preset",)
    elif name is None:
        name = "tiny" if "tiny" in presets else next(iter(presets), "")
    if name and name not in presets:
        source = "--preset" if path == ("presets",) else "default_preset"
        raise ir.doc.error(f"unknown graph preset '{name}' (from {source})", path,
                           did_you_mean(name, presets) or "this graph declares no presets",
                           key=path == ("presets",))
    ir.preset = name
    return presets.get(name, {})


def _device_memory(ir: IR, preset: dict[str, Any]) -> int:
    if ir.options.device_memory is not None:
        return ir.options.device_memory
    if "device_memory" not in preset:    # a composed graph: room for every model it includes on one rank
        return sum(i.device_memory for i in ir.includes.values() if "." not in i.model.name) or DEFAULT_DEVICE_MEMORY
    try:
        return parse_size(preset["device_memory"])
    except ValueError as exc:
        raise ir.doc.error(str(exc), ("presets", ir.preset, "device_memory")) from None


def _check_value(ir: IR, spec: plan.Param, value: Any, path: Path) -> None:
    if not isinstance(value, _PY_TYPES[spec.type]) or (spec.type != "boolean" and isinstance(value, bool)):
        raise ir.doc.error(f"param '{spec.name}' is {spec.type}, got {value!r}", path)
    if spec.minimum is not None and value < spec.minimum:
        raise ir.doc.error(f"{value!r} is below the minimum {spec.minimum} of param '{spec.name}'", path)
    if spec.maximum is not None and value > spec.maximum:
        raise ir.doc.error(f"{value!r} is above the maximum {spec.maximum} of param '{spec.name}'", path)
    if spec.choices is not None and value not in spec.choices:
        raise ir.doc.error(f"{value!r} is not one of param '{spec.name}' choices {spec.choices}", path)


def _params(ir: IR, preset: dict[str, Any]) -> None:
    overrides = preset.get("params", {})
    for name, raw in ir.doc.data.get("params", {}).items():
        path: Path = ("params", name)
        lo, hi = raw.get("minimum"), raw.get("maximum")
        if lo is not None and hi is not None and lo > hi:
            raise ir.doc.error(f"param '{name}': minimum {lo} is above maximum {hi}", (*path, "minimum"))
        if raw["type"] not in ("integer", "number") and (lo is not None or hi is not None):
            raise ir.doc.error(f"param '{name}' of type {raw['type']} cannot have bounds", path)
        spec = plan.Param(name=name, type=raw["type"], default=raw.get("default"), minimum=lo,
                          maximum=hi, choices=raw.get("enum"), doc=raw.get("doc", ""))
        if spec.default is not None:
            _check_value(ir, spec, spec.default, (*path, "default"))
        if name in overrides:
            _check_value(ir, spec, overrides[name], ("presets", ir.preset, "params", name))
            spec = plan.Param(**{**_fields(spec), "default": overrides[name]})
        ir.params[name] = ParamIR(spec, path)
    for name, value in overrides.items():
        path = ("presets", ir.preset, "params", name)
        if name not in ir.params:
            raise ir.doc.error(f"preset '{ir.preset}' sets unknown param '{name}'", path,
                               did_you_mean(name, ir.params), key=True)
        if name not in ir.doc.data.get("params", {}):      # an included graph's (`llm.max_tokens`)
            spec = ir.params[name].spec
            _check_value(ir, spec, value, path)
            ir.params[name] = ParamIR(plan.Param(**{**_fields(spec), "default": value}), path)


def _fields(struct: plan.Param) -> dict[str, Any]:
    return {f: getattr(struct, f) for f in struct.__struct_fields__}


def _nodes(ir: IR, preset: dict[str, Any]) -> None:
    raw_nodes: dict[str, Any] = ir.doc.data.get("nodes", {})
    preset_map = preset.get("nodes", {})
    verbs = {"nodes": "maps", "layers": "cuts", "quant": "quantizes"}
    for key, verb in verbs.items():
        for name in preset.get(key, {}):
            if name not in raw_nodes:
                raise ir.doc.error(f"preset '{ir.preset}' {verb} unknown node '{name}'",
                                   ("presets", ir.preset, key, name), did_you_mean(name, raw_nodes), key=True)
            if key != "nodes" and "same_as" in raw_nodes[name]:
                raise ir.doc.error(f"node '{name}' shares weights (same_as): its {key} are those of "
                                   f"'{raw_nodes[name]['same_as']}'", ("presets", ir.preset, key, name), key=True)
    for name in ir.options.quant:
        if name.partition(".")[0] in ir.includes:     # the include's own (pass include)
            continue
        if name not in raw_nodes or "same_as" in raw_nodes[name]:
            hint = did_you_mean(name, raw_nodes) if name not in raw_nodes else \
                f"it shares weights (same_as): quantize '{raw_nodes[name]['same_as']}'"
            raise CompileError(f"--quant {name}={ir.options.quant[name]}: the graph has no node '{name}' to quantize"
                               if name not in raw_nodes else f"--quant {name}: node '{name}' cannot set it", hint=hint)
    if plan.CLIENT in raw_nodes:     # `from: client.<item>` would name this node, not the request's client
        raise ir.doc.error(f"'{plan.CLIENT}' is reserved: a stream `from: {plan.CLIENT}.<item>` names the "
                           "request's client", ("nodes", plan.CLIENT), "rename the node", key=True)
    for name, raw in raw_nodes.items():
        if "same_as" not in raw:
            ir.nodes[name] = _root_node(ir, name, raw, preset, preset_map)
    for name, raw in raw_nodes.items():
        if "same_as" in raw:
            ir.nodes[name] = _shared_node(ir, name, raw, raw_nodes, preset_map)
    included = {name: node for name, node in ir.nodes.items() if name not in raw_nodes}
    ir.nodes = {**included, **{name: ir.nodes[name] for name in raw_nodes}}
    _weights(ir, preset, raw_nodes)


def _weights(ir: IR, preset: dict[str, Any], own: dict[str, Any]) -> None:
    """Attach the preset's weight sources (a path or a checked `weight_map`) to the graph's `own` nodes
    (an included graph's have its own preset's); `same_as` nodes read their root's. A graph without
    presets declares no weights, so its nodes are random by declaration."""
    sources: dict[str, Any] = preset.get("weights", {})
    maps: dict[str, plan.WeightMap] = {}
    for name, source in sources.items():
        path: Path = ("presets", ir.preset, "weights", name)
        if name not in own:
            raise ir.doc.error(f"preset '{ir.preset}' gives weights for unknown node '{name}'", path,
                               did_you_mean(name, own), key=True)
        if ir.nodes[name].weight_key != name:
            raise ir.doc.error(f"node '{name}' shares weights (same_as) and cannot name its own", path,
                               f"give the weights to '{ir.nodes[name].weight_key}'", key=True)
        if isinstance(source, dict):
            maps[name] = weight_map.resolve(ir, ir.nodes[name], source, path)
    is_random = bool(preset.get("random_weights", not ir.preset))
    for node in (ir.nodes[name] for name in own):
        source = sources.get(node.weight_key)
        node.weights = source if isinstance(source, str) else None
        node.weight_map = maps.get(node.weight_key)
        node.random_weights = is_random


def _root_node(ir: IR, name: str, raw: dict[str, Any], preset: dict[str, Any],
               preset_map: dict[str, str]) -> NodeIR:
    path: Path = ("nodes", name)
    if "kind" not in raw:
        raise ir.doc.error(f"node '{name}' needs `kind:` (or `same_as:` another node)", path)
    kind = raw["kind"]
    if kind not in ir.catalogue:
        raise ir.doc.error(f"unknown component kind '{kind}'", (*path, "kind"),
                           did_you_mean(kind, ir.catalogue.kinds()))
    spec = ir.catalogue[kind]
    preset_name, preset_path = _node_preset(ir, name, raw, preset_map)
    if preset_name not in spec.presets:
        raise ir.doc.error(f"kind '{kind}' has no preset '{preset_name}'", preset_path,
                           did_you_mean(preset_name, spec.presets))
    dims = dict(spec.presets[preset_name])
    for key, value in raw.get("dims", {}).items():
        if key not in dims:
            raise ir.doc.error(f"kind '{kind}' has no dim '{key}'", (*path, "dims", key),
                               did_you_mean(key, dims), key=True)
        dims[key] = value
    node = NodeIR(name=name, kind=kind, spec=spec, preset=preset_name, dims=dims, args={},
                  param_args={}, weight_key=name, dtype=raw.get("dtype", preset.get("dtype", "bf16")),
                  has_kv_cache=False, block_tokens=DEFAULT_BLOCK_TOKENS, max_blocks=None,
                  max_batch=1, path=path)
    if name in preset.get("layers", {}):
        _cut_layers(ir, node, preset["layers"][name])
    _quant(ir, node, raw, preset)
    _apply_node_options(ir, node, raw, dict(spec.args))
    return node


def _quant(ir: IR, node: NodeIR, raw: dict[str, Any], preset: dict[str, Any]) -> None:
    """The node's `quant:` (the graph preset's, where it names the node, else the node's own), checked
    against its kind (mstar_compiler.quant)."""
    scheme, path = raw.get("quant", "none"), (*node.path, "quant")
    if node.name in preset.get("quant", {}):
        scheme, path = preset["quant"][node.name], ("presets", ir.preset, "quant", node.name)
    given = f" (--quant {node.name}={ir.options.quant[node.name]})" if node.name in ir.options.quant else ""
    if given:
        scheme, path = ir.options.quant[node.name], node.path
    if scheme == "none":
        return
    why = quant.why_not(node.spec, node.dims, scheme)
    if why:
        raise ir.doc.error(f"node '{node.name}' cannot be quantized{given}: {why}", path)
    node.quant, node.quant_path = scheme, path


def _cut_layers(ir: IR, node: NodeIR, layers: int) -> None:
    """Build `node` with `layers` of its kind preset's layers (the graph preset's `layers:`)."""
    path: Path = ("presets", ir.preset, "layers", node.name)
    key = node.spec.layer_dim
    if key not in node.dims:
        raise ir.doc.error(f"kind '{node.kind}' has no layer count to cut (no dim '{key}')", path)
    published = int(node.dims[key])
    if layers > published:
        raise ir.doc.error(f"node '{node.name}' has {published} layers in preset '{node.preset}': "
                           f"`layers:` can only declare fewer, not {layers}", path)
    if layers < published:
        node.dims[key], node.declared_layers, node.published_layers = layers, layers, published


def _node_preset(ir: IR, name: str, raw: dict[str, Any], preset_map: dict[str, str]) -> tuple[str, Path]:
    if name in preset_map:
        return preset_map[name], ("presets", ir.preset, "nodes", name)
    if "preset" in raw:
        return raw["preset"], ("nodes", name, "preset")
    return "tiny", ("nodes", name)


def _shared_node(ir: IR, name: str, raw: dict[str, Any], raw_nodes: dict[str, Any],
                 preset_map: dict[str, str]) -> NodeIR:
    path: Path = ("nodes", name)
    for key in ("kind", "preset", "dims", "dtype", "quant"):
        if key in raw:
            raise ir.doc.error(f"node '{name}' shares weights (same_as) and cannot set `{key}`",
                               (*path, key), f"it takes `{key}` from '{raw['same_as']}'", key=True)
    if name in preset_map:
        raise ir.doc.error(f"preset '{ir.preset}' maps node '{name}', which takes its preset from same_as",
                           ("presets", ir.preset, "nodes", name), "map the node it shares weights with", key=True)
    root_name = _same_as_root(ir, name, raw_nodes)
    root = ir.nodes[root_name]
    node = NodeIR(name=name, kind=root.kind, spec=root.spec, preset=root.preset, dims=dict(root.dims),
                  args={}, param_args={}, weight_key=root_name, dtype=root.dtype,
                  has_kv_cache=False, block_tokens=root.block_tokens, max_blocks=root.max_blocks,
                  max_batch=1, path=path)
    node.declared_layers, node.published_layers = root.declared_layers, root.published_layers
    node.quant, node.quant_path = root.quant, root.quant_path
    defaults = {**root.spec.args, **root.args, **{k: f"${v}" for k, v in root.param_args.items()}}
    _apply_node_options(ir, node, {**raw_nodes[root_name], **raw}, defaults)
    return node


def _same_as_root(ir: IR, name: str, raw_nodes: dict[str, Any]) -> str:
    seen = [name]
    current = name
    while "same_as" in raw_nodes[current]:
        target = raw_nodes[current]["same_as"]
        if target not in raw_nodes:
            raise ir.doc.error(f"same_as names unknown node '{target}'", ("nodes", current, "same_as"),
                               did_you_mean(target, raw_nodes))
        if target in seen:
            raise ir.doc.error(f"same_as cycle: {' -> '.join([*seen, target])}", ("nodes", name, "same_as"),
                               "one node of the group must declare `kind:`")
        seen.append(target)
        current = target
    return current


def _apply_node_options(ir: IR, node: NodeIR, raw: dict[str, Any], defaults: dict[str, Any]) -> None:
    spec = node.spec
    args = dict(defaults)
    for key, value in raw.get("args", {}).items():
        if key not in spec.args:
            raise ir.doc.error(f"kind '{spec.kind}' takes no arg '{key}'", (*node.path, "args", key),
                               did_you_mean(key, spec.args) or f"kind '{spec.kind}' takes no args", key=True)
        args[key] = value
    for key, value in args.items():
        if value is None and key != "weights":
            raise ir.doc.error(f"kind '{spec.kind}' needs arg '{key}'", node.path,
                               f"give it under `args:`, a constant or a $param (e.g. args: {{{key}: $my_param}})")
        if isinstance(value, str) and value.startswith("$"):
            node.param_args[key] = param_ref(ir, value, (*node.path, "args", key))
        else:
            node.args[key] = value
    kv = raw.get("kv_cache", "paged" if spec.has_kv_cache else "none")
    if kv != "none" and not spec.has_kv_cache:
        raise ir.doc.error(f"kind '{spec.kind}' keeps no KV cache", (*node.path, "kv_cache"),
                           "remove `kv_cache:`")
    node.has_kv_cache = kv != "none"
    if isinstance(kv, dict):
        node.block_tokens = kv.get("page_tokens", DEFAULT_BLOCK_TOKENS)
        node.max_blocks = kv.get("max_pages")
    node.max_batch = raw.get("batch", DEFAULT_MAX_BATCH if spec.can_batch else 1)
    node.executor = raw.get("executor", spec.default_executor)
    if node.max_batch > 1 and not spec.can_batch:
        raise ir.doc.error(f"kind '{spec.kind}' cannot batch requests", (*node.path, "batch"),
                           "use batch: 1 or leave it out")

