"""The cluster YAML format: reading it, validating it, and saying exactly what is wrong.

Structure (keys, types, required fields) is checked by a JSON schema; quantities with
units, positivity and device-type references are checked here. Every problem becomes
one ``ClusterSpecError`` line ``<file>: <field path>: <what is wrong>``, e.g.
``bad.yaml: nodes[1].intra_link.bandwidth: must be a positive quantity, got -5 GB/s``.
The format itself is documented in ``cluster_specs/README.md``.
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from unity_cli.cluster.spec import (
    DTYPES,
    ClusterSpec,
    DeviceKind,
    DeviceType,
    Link,
    NodeSpec,
    default_launch_overhead,
)
from unity_cli.cluster.units import Dimension, format_quantity, parse_quantity
from unity_cli.errors import ClusterSpecError

__all__ = ["bundled_clusters", "cluster_path", "load_cluster", "parse_cluster"]

MAX_DEVICES = 65_536
"""The most devices a cluster may have (and nodes, and devices per node): a plan of more
would take hours to simulate, and a typo (count: 1e9) should fail at once, not run for minutes."""

_QUANTITY: dict[str, Any] = {"type": ["number", "string"]}
_LINK: dict[str, Any] = {
    "type": "object",
    "properties": {"bandwidth": _QUANTITY, "latency": _QUANTITY},
    "required": ["bandwidth", "latency"],
    "additionalProperties": False,
}
_DEVICE_TYPE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"enum": [kind.value for kind in DeviceKind]},
        "peak_flops": {
            "type": "object",
            "properties": {dtype: _QUANTITY for dtype in DTYPES},
            "additionalProperties": False,
            "minProperties": 1,
        },
        "memory": {
            "type": "object",
            "properties": {"bandwidth": _QUANTITY, "capacity": _QUANTITY, "cache": {
                "type": "object",
                "properties": {"bandwidth": _QUANTITY, "capacity": _QUANTITY},
                "required": ["bandwidth", "capacity"],
                "additionalProperties": False,
            }},
            "required": ["bandwidth", "capacity"],
            "additionalProperties": False,
        },
        "launch_overhead": _QUANTITY,
    },
    "required": ["kind", "peak_flops", "memory"],
    "additionalProperties": False,
}
_NODE_FIELDS: dict[str, Any] = {
    "device": {"type": "string", "minLength": 1},
    "devices": {"type": "integer", "minimum": 1, "maximum": 65_536},
    "intra_link": _LINK,
}
_GROUP_KEYWORDS: dict[str, Any] = {
    "properties": {
        **_NODE_FIELDS,
        "count": {"type": "integer", "minimum": 1, "maximum": 65_536},
        "name": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "device_types": {
            "type": "object", "minProperties": 1, "additionalProperties": _DEVICE_TYPE,
        },
        "node_defaults": {
            "type": "object", "properties": _NODE_FIELDS, "additionalProperties": False,
        },
        # One group (a mapping) or a list of groups: object keywords apply to the
        # former, "items" to the latter.
        "nodes": {
            "type": ["object", "array"], "minItems": 1,
            "items": {"type": "object", **_GROUP_KEYWORDS}, **_GROUP_KEYWORDS,
        },
        "inter_node_link": _LINK,
    },
    "required": ["name", "device_types", "nodes"],
    "additionalProperties": False,
}
_VALIDATOR = jsonschema.Draft202012Validator(_SCHEMA)
_TYPE_WORDS = {
    "object": "a mapping", "array": "a list", "string": "a string",
    "integer": "an integer", "number": "a number",
}


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float)):
                continue  # unhashable keys are left to the base class to reject
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


BUNDLED = Path(__file__).resolve().parents[1] / "data" / "clusters"
"""The cluster specs the package ships (the repo's ``cluster_specs/``): ``--cluster NAME``."""

MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_VALUES = 100_000
"""A cluster spec's size limits, checked before the schema walks it: the bundled ones are a
few KiB and a few hundred values; a YAML alias bomb expands to billions."""


def bundled_clusters() -> dict[str, Path]:
    """The shipped cluster specs by name (the file name without ``.yaml``), sorted."""
    return {p.stem: p for p in sorted(BUNDLED.glob("*.yaml"))}


SIZED = re.compile(r"^(?P<base>[^:]+):(?P<devices>[0-9]{1,7})$")
"""``--cluster SPEC:N``: a spec of identical nodes grown (or cut) to ``N`` devices."""


def sized(spec: str | os.PathLike[str]) -> tuple[str, int | None]:
    """``(spec, devices)`` of ``SPEC:N`` (``N`` None where the spec names no size, or is a
    file of that very name)."""
    text = os.fspath(spec)
    m = SIZED.match(text)
    if m is None or Path(text).exists():
        return text, None
    return m["base"], int(m["devices"])


def cluster_path(spec: str | os.PathLike[str]) -> Path:
    """The file ``--cluster`` names: a path when one exists there, else a bundled spec's
    name (``dgx-a100-8`` or ``dgx-a100-8.yaml``), else a ClusterSpecError listing them. A
    sized name (``dgx-a100-80:64``) names its base's file."""
    given = spec
    spec, _ = sized(spec)
    p = Path(spec)
    if p.exists():
        return p
    shipped = bundled_clusters()
    name = p.name[:-len(".yaml")] if p.name.endswith(".yaml") else p.name
    if (p.parent == Path(".") or p.parent == Path("cluster_specs")) and name in shipped:
        return shipped[name]
    raise ClusterSpecError(f"{given}: no such file, and not a bundled cluster ({', '.join(shipped)}; "
                           "'unity clusters' lists them)")


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """Read and validate a cluster YAML (a path, or a bundled spec's name; ``SPEC:N`` for a
    spec of identical nodes sized to ``N`` devices, named so); every problem is one
    ``ClusterSpecError`` line."""
    source = str(path)
    _, size = sized(path)
    path = cluster_path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise ClusterSpecError(f"{source}: more than {MAX_SPEC_BYTES >> 20} MiB: not a cluster spec")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ClusterSpecError(f"{source}: cannot read: {reason}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ClusterSpecError(f"{source}: {where}YAML does not parse: {problem}") from None
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"{source}: YAML does not parse: {exc}") from None
    except RecursionError:
        raise ClusterSpecError(f"{source}: YAML nested too deep to be a cluster spec") from None
    if data is None:
        raise ClusterSpecError(f"{source}: file is empty")
    _check_size(data, source)
    if size is not None:
        data = _resized(data, size, source)
    return parse_cluster(data, source)


def _resized(data: Any, devices: int, source: str) -> Any:
    """The spec ``data`` with its identical nodes counted to hold ``devices`` devices (fewer
    than one node's, or a spec of one node of CPU cores and no network: one node of that
    many), named ``SOURCE``."""
    nodes = data.get("nodes") if isinstance(data, Mapping) else None
    per = nodes.get("devices") if isinstance(nodes, Mapping) else None
    if not isinstance(per, int) or isinstance(per, bool) or per < 1:
        raise ClusterSpecError(f"{source}: only a spec of identical nodes (nodes: {{count, devices, ...}}) "
                               "can be sized")
    types = data.get("device_types")
    kind = types.get(nodes.get("device"), {}) if isinstance(types, Mapping) else {}
    # one machine of CPU cores without a network (local-cpu): N cores, one rank each
    one_machine = nodes.get("count") == 1 and "inter_node_link" not in data and \
        isinstance(kind, Mapping) and kind.get("kind") == "cpu"
    if devices > MAX_DEVICES:
        raise ClusterSpecError(f"{source}: {devices} devices; unity plans for at most {MAX_DEVICES}")
    if devices < 1 or devices > per and devices % per and not one_machine:
        raise ClusterSpecError(f"{source}: {devices} devices are not whole nodes of {per}")
    count, per = (1, devices) if devices <= per or one_machine else (devices // per, per)
    out = {**data, "name": source, "nodes": {**nodes, "count": count, "devices": per}}
    if count > 1 and "inter_node_link" not in data:
        raise ClusterSpecError(f"{source}: {count} nodes need an inter_node_link, which the spec does not give")
    return out


def _check_size(data: object, source: str) -> None:
    """Refuse a document of more than :data:`MAX_SPEC_VALUES` values, counting every value
    an alias repeats (the walk stops at the limit, so a bomb costs no more than that)."""
    stack, seen = [data], 0
    while stack:
        x = stack.pop()
        seen += 1
        if seen > MAX_SPEC_VALUES:
            raise ClusterSpecError(f"{source}: the document expands to more than {MAX_SPEC_VALUES:,} values "
                                   "(YAML aliases repeating aliases?): not a cluster spec")
        if isinstance(x, Mapping):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def parse_cluster(data: object, source: str = "<cluster spec>") -> ClusterSpec:
    """Validate parsed YAML/JSON ``data`` and build the spec; ``source`` prefixes errors."""
    if not isinstance(data, Mapping):
        raise ClusterSpecError(f"{source}: top level must be a mapping, got {_kind(data)}")
    # YAML allows keys of any type; a device type named 7 would make a confusing path.
    device_types = data.get("device_types")
    for name in device_types if isinstance(device_types, Mapping) else ():
        if not isinstance(name, str):
            raise _error(source, "device_types", f"names must be strings, got {name!r}")
    errors = sorted(_VALIDATOR.iter_errors(data), key=_error_order)
    if errors:
        raise _schema_error(source, errors[0])
    types = {name: _device_type(name, body, source, f"device_types.{name}")
             for name, body in data["device_types"].items()}
    defaults = data.get("node_defaults", {})
    if "device" in defaults:
        _lookup(types, defaults["device"], source, "node_defaults.device")
    if "intra_link" in defaults:
        _link(defaults["intra_link"], source, "node_defaults.intra_link")
    groups = data["nodes"]
    nodes: list[NodeSpec] = []
    names: set[str] = set()
    for index, group in enumerate([groups] if isinstance(groups, Mapping) else groups):
        here = "nodes" if isinstance(groups, Mapping) else f"nodes[{index}]"
        merged = {**defaults, **group}
        for key in ("device", "devices", "intra_link"):
            if key not in merged:
                raise _error(source, f"{here}.{key}",
                             "missing required field (set it here or in node_defaults)")
        device = _lookup(types, merged["device"], source, _field(group, here, "device"))
        link = _link(merged["intra_link"], source, _field(group, here, "intra_link"))
        count = int(group.get("count", 1))
        if "name" in group and count != 1:
            raise _error(source, f"{here}.name", "only a single node (count: 1) can be "
                         "named; nodes of a larger group are named node<index>")
        for _ in range(count):
            name = group.get("name", f"node{len(nodes)}")
            if name in names:
                raise _error(source, f"{here}.name" if "name" in group else here,
                             f"duplicate node name {name!r}")
            names.add(name)
            nodes.append(NodeSpec(name, device, int(merged["devices"]), link))
    total = sum(n.devices for n in nodes)
    if total > MAX_DEVICES:
        raise _error(source, "nodes", f"{total} devices in all; unity plans for at most {MAX_DEVICES}")
    if "inter_node_link" in data:
        inter = _link(data["inter_node_link"], source, "inter_node_link")
    elif len(nodes) > 1:
        raise _error(source, "inter_node_link",
                     f"missing required field (the cluster has {len(nodes)} nodes)")
    else:
        inter = nodes[0].intra_link  # never crossed; keeps the field a plain Link
    return ClusterSpec(data["name"], tuple(nodes), inter)


def _field(group: Mapping[str, Any], here: str, key: str) -> str:
    """Path of a node field: the group's own value, or the node_defaults it inherits."""
    return f"{here}.{key}" if key in group else f"node_defaults.{key}"


def _device_type(name: str, body: Mapping[str, Any], source: str, here: str) -> DeviceType:
    kind = DeviceKind(body["kind"])
    flops = tuple(
        (dtype, _quantity(value, Dimension.FLOPS, source, f"{here}.peak_flops.{dtype}"))
        for dtype, value in body["peak_flops"].items()
    )
    memory = body["memory"]
    bandwidth = _quantity(memory["bandwidth"], Dimension.BANDWIDTH, source,
                          f"{here}.memory.bandwidth")
    capacity = _quantity(memory["capacity"], Dimension.BYTES, source, f"{here}.memory.capacity")
    if capacity < 1:
        raise _error(source, f"{here}.memory.capacity", f"must be at least 1 byte, got {memory['capacity']}")
    cache_capacity, cache_bandwidth = 0, 0.0
    if "cache" in memory:
        cache = memory["cache"]
        cache_bandwidth = _quantity(cache["bandwidth"], Dimension.BANDWIDTH, source, f"{here}.memory.cache.bandwidth")
        cache_capacity = round(_quantity(cache["capacity"], Dimension.BYTES, source, f"{here}.memory.cache.capacity"))
        if not 1 <= cache_capacity < capacity:
            raise _error(source, f"{here}.memory.cache.capacity",
                         f"must be at least 1 byte and less than memory.capacity, got {cache['capacity']}")
        if cache_bandwidth < bandwidth:
            raise _error(source, f"{here}.memory.cache.bandwidth",
                         f"must be at least memory.bandwidth ({memory['bandwidth']}), got {cache['bandwidth']}")
    if "launch_overhead" in body:
        overhead = _quantity(body["launch_overhead"], Dimension.TIME, source,
                             f"{here}.launch_overhead", allow_zero=True)
    else:
        overhead = default_launch_overhead(kind)
    return DeviceType(name, kind, flops, bandwidth, round(capacity), overhead, cache_capacity, cache_bandwidth)


def _link(body: Mapping[str, Any], source: str, here: str) -> Link:
    return Link(
        _quantity(body["bandwidth"], Dimension.BANDWIDTH, source, f"{here}.bandwidth"),
        _quantity(body["latency"], Dimension.TIME, source, f"{here}.latency", allow_zero=True),
    )


def _lookup(types: Mapping[str, DeviceType], name: str, source: str, here: str) -> DeviceType:
    if name in types:
        return types[name]
    close = difflib.get_close_matches(name, list(types), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise _error(source, here, f"unknown device type {name!r}{hint} "
                 f"(defined in device_types: {', '.join(types)})")


def _quantity(value: object, dimension: Dimension, source: str, here: str,
              *, allow_zero: bool = False) -> float:
    try:
        number = parse_quantity(value, dimension)
    except ValueError as exc:
        raise _error(source, here, str(exc)) from None
    if number < 0 or (number == 0 and not allow_zero):
        wanted = "non-negative" if allow_zero else "positive"
        shown = value if isinstance(value, str) else format_quantity(number, dimension)
        raise _error(source, here, f"must be a {wanted} quantity, got {shown}")
    return number


def _error(source: str, here: str, message: str) -> ClusterSpecError:
    return ClusterSpecError(f"{source}: {here}: {message}" if here else f"{source}: {message}")


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def _dotted(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _error_order(error: jsonschema.ValidationError) -> tuple[Any, ...]:
    # Shallow problems first (a misspelled top-level key explains deeper ones),
    # then document order, so the reported error is deterministic.
    path = tuple((isinstance(p, str), str(p) if isinstance(p, str) else p)
                 for p in error.absolute_path)
    # At one place, a misspelled key explains the "missing" field it was meant to be.
    return (len(path), path, error.validator != "additionalProperties")


def _schema_error(source: str, error: jsonschema.ValidationError) -> ClusterSpecError:
    here = _dotted(error.absolute_path)
    schema, instance = error.schema, error.instance
    match error.validator:
        case "additionalProperties":
            allowed = sorted(schema.get("properties", {}))
            key = sorted((k for k in instance if k not in allowed), key=str)[0]
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            where = _dotted([*error.absolute_path, str(key)])
            return _error(source, where, f"unknown key{hint} (allowed: {', '.join(allowed)})")
        case "required":
            missing = next(k for k in schema["required"] if k not in instance)
            return _error(source, _dotted([*error.absolute_path, missing]),
                          "missing required field")
        case "type":
            wanted = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            words = " or ".join(_TYPE_WORDS[t] for t in wanted)
            if wanted == ["number", "string"]:
                words = "a number or a string with a unit"
            return _error(source, here, f"must be {words}, got {_kind(instance)}")
        case "minimum":
            return _error(source, here, f"must be at least {schema['minimum']}, got {instance}")
        case "minItems" | "minProperties" | "minLength":
            return _error(source, here, "must not be empty")
        case "enum":
            options = ", ".join(repr(v) for v in schema["enum"])
            return _error(source, here, f"must be one of {options}, got {instance!r}")
        case _:
            return _error(source, here, error.message)
