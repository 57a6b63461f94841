"""Repeated blocks (``ir/blocks.py``): a decoder's layers are found as one run, by structure
only, and the graph shortened to fewer of them is the same graph with fewer layers."""
from __future__ import annotations

import onnx
import pytest

from unity_cli.ir.blocks import MIN_BLOCKS, Blocks, Run, blocks, find_run, lengthened, likes, shortened
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.zoo import WeightMode, Weights, llm
from unity_cli.zoo.layers import linear
from unity_cli.zoo.net import Net


def deep(tmp_path, family: str, layers: int, batch: int = 4):
    """A small decoder of ``layers`` layers (``llama``: GQA, rotary; ``gpt``: learned positions)."""
    net = Net(f"deep_{family}", Weights(WeightMode.INLINE), seed=1)
    if family == "llama":
        doc = llm.build_llama(net, llm.LlamaConfig(layers, 32, 4, 2, 88, 16, 64), batch)
    else:
        doc = llm.build_gpt(net, llm.GptConfig(layers, 32, 4, 128, 16, 128, 16), batch)
    path = tmp_path / f"{family}{layers}.onnx"
    onnx.save(net.model(doc), path)
    return import_model(path, ImportOptions(batch)).pcg


def chain(tmp_path, widths):
    """Linear + Relu layers of the given widths, then a sum: the simplest run."""
    net = Net("chain", Weights(WeightMode.INLINE), seed=1)
    x = net.input("x", [4, widths[0]])
    for k, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        x = linear(net, x, a, b, f"layer{k}", act="Relu")
    net.output(net.node("ReduceSum", [x], "sum", keepdims=0), [4])
    path = tmp_path / "chain.onnx"
    onnx.save(net.model("chain"), path)
    return import_model(path, ImportOptions(4)).pcg


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("layers", [5, 7])
def test_a_decoders_layers_are_one_run(tmp_path, family, layers):
    g = deep(tmp_path, family, layers)
    found = blocks(g)
    run = found.run
    assert run is not None
    # every layer but the first (it reads the embedding, not a layer) is a block of the run,
    # or all of them: the run covers the layers and nothing else
    assert run.count in (layers - 1, layers)
    assert run.count * run.period >= (layers - 1) * 2
    keys = found.keys
    assert all(keys[s] == keys[s + run.period] for s in range(run.start, run.end - run.period))
    assert run.end <= len(found.segments)


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_the_shortened_graph_is_the_graph_with_fewer_layers(tmp_path, family, keep):
    g = deep(tmp_path, family, 6)
    found = blocks(g)
    run = found.run
    short = shortened(g, found, keep)
    validate(short)
    ops = [n.kind for _, n in g if not n.spec.is_source]
    short_ops = [n.kind for _, n in short if not n.spec.is_source]
    per_block = sum(len(found.segments[s]) for s in range(run.start, run.start + run.period))
    assert len(short_ops) == len(ops) - (run.count - keep) * per_block
    # the same graph as one built with that many layers, but for names
    fewer = deep(tmp_path, family, 6 - (run.count - keep))
    assert short.canonical_hash != g.canonical_hash
    assert [(n.kind, n.outputs) for _, n in short] == [(n.kind, n.outputs) for _, n in fewer] or \
        sorted(str((n.kind, n.outputs)) for _, n in short) == sorted(str((n.kind, n.outputs)) for _, n in fewer)
    again = blocks(short)
    assert [len(s) for s in again.segments] == \
        [len(s) for s in found.segments[:run.start + keep * run.period]] + [len(s) for s in found.segments[run.end:]]
    assert shortened(g, found, run.count) is g


def test_a_layer_that_differs_ends_the_run(tmp_path):
    same = blocks(chain(tmp_path, [16] * 10)).run
    assert same is not None and same.count * same.period >= 16     # 9 layers, each a product and a Relu
    g = chain(tmp_path, [16] * 5 + [24] + [16] * 5)
    found = blocks(g)
    run = found.run
    assert run is not None and run.count < same.count
    inside = [i for s in range(run.start, run.end) for i in found.segments[s]]
    wide = [i for i, n in g if any(d.size == 24 for d in n.outputs[0].dims) and not n.spec.is_source]
    assert wide and not set(wide) & set(inside), "the wider layer is in the run"
    assert blocks(chain(tmp_path, [16, 24, 16, 24, 16])).run is None     # too few to be a run


@pytest.mark.parametrize("keys,run", [
    ("xababababy", Run(1, 2, 4)),
    ("aaaaa", Run(0, 1, 5)),
    ("abcabcabcabcz", Run(0, 3, 4)),
    ("abababa", None),            # three whole blocks of two
    ("abcdefgh", None),
    ("aabaabaabaab", Run(0, 3, 4)),
])
def test_find_run(keys, run):
    assert MIN_BLOCKS == 4
    assert find_run(list(keys)) == run


def _renamer(whole, short):
    """Names of the whole graph's blocks for the copies of the shortened graph's last block."""
    like = likes(whole, blocks(whole))
    at = {n.name: i for i, n in whole}

    def rename(j: int, v: int):
        twin = like(at[short.nodes[v].name], j)
        assert twin is not None, short.nodes[v].name
        return short.nodes[v].op, whole.nodes[twin].name
    return rename


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("keep", [1, 2, 3])
def test_lengthening_the_shortened_graph_gives_the_whole_back(tmp_path, family, keep):
    g = deep(tmp_path, family, 7)
    found = blocks(g)
    short = shortened(g, found, keep)
    again = blocks(short)
    assert len(again.segments) == len(found.segments) - (found.run.count - keep) * found.run.period
    # its run, as few blocks as it has
    run = Run(found.run.start, found.run.period, keep)
    longer, origin = lengthened(short, Blocks(again.segments, again.keys, run), found.run.count - keep,
                                _renamer(g, short))
    validate(longer)
    assert len(longer) == len(g) and longer.canonical_hash == g.canonical_hash
    assert sorted(n.name for _, n in longer if n.spec.is_source) == sorted(n.name for _, n in g if n.spec.is_source)
    assert all(longer.nodes[i].op == short.nodes[o].op for i, o in enumerate(origin))
    # and a wrong count of blocks is another graph
    other, _ = lengthened(short, Blocks(again.segments, again.keys, run), found.run.count - keep - 1)
    assert other.canonical_hash != g.canonical_hash
