"""Every field of a cluster spec, given a bad value, is refused in one line naming the file
and the field's path (#13): hypothesis draws the values, for each leaf of the bundled
heterogeneous spec (device types, node defaults, node groups, links)."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unity_cli.cluster import parse_cluster
from unity_cli.errors import ClusterSpecError

REPO = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((REPO / "cluster_specs" / "mixed-a100-v100.yaml").read_text())


def _leaves(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


LEAVES = [p for p in _leaves(SPEC) if p[-1] != "name"]    # any string is a name
WRONG_TYPE = st.sampled_from([[], {}, [1, 2], {"a": 1}, True, None])
NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf, "nan GB/s", "inf us", "1e1000000 GB/s"])
GARBAGE = st.sampled_from(["", "fast", "5 parsecs", "GB/s", "12 12", "-", "1e", "0x10 GB"])


def _bad(path) -> st.SearchStrategy:
    leaf = path[-1]
    if leaf in ("count", "devices"):
        return st.one_of(st.integers(max_value=0), st.integers(min_value=65_537, max_value=2**70),
                         st.floats(allow_nan=False).filter(lambda v: not float(v).is_integer()),
                         GARBAGE, WRONG_TYPE)
    if leaf == "device":
        return st.one_of(st.text(min_size=1, max_size=12).filter(lambda s: s not in SPEC["device_types"]),
                         WRONG_TYPE)
    if leaf == "kind":
        return st.one_of(st.text(max_size=8).filter(lambda s: s not in ("gpu", "cpu")), WRONG_TYPE)
    # a quantity: latencies may be 0, everything else must be positive
    low = st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False) if leaf == "latency" else \
        st.floats(max_value=0, allow_nan=False, allow_infinity=False)
    return st.one_of(low, NOT_FINITE, GARBAGE, WRONG_TYPE)


@pytest.mark.parametrize("path", LEAVES, ids=[_where(p) for p in LEAVES])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_value_names_the_file_and_the_field(path, data):
    value = data.draw(_bad(path))
    doc = copy.deepcopy(SPEC)
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(ClusterSpecError) as e:
        parse_cluster(doc, "f.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("f.yaml: "), msg
    where = _where(path)
    # A typed leaf is named by its path; a reference or a group may be named by its parent.
    assert where in msg or _where(path[:-1]) in msg, (where, msg)


def test_the_spec_itself_is_good():
    assert parse_cluster(copy.deepcopy(SPEC), "f.yaml").num_devices == 26
