"""Classic model-zoo CNNs rebuilt with ``onnx.helper`` at opset 9.

Each builder returns an ``onnx.ModelProto`` shaped like the old ONNX model-zoo
files (caffe2 / early PyTorch conversions):

* opset 9, IR version 4 (ONNX 1.4);
* every initializer is ALSO listed as a graph input, after ``data``;
* ``data`` is ``[N, 3, 224, 224]`` float with a symbolic batch dim ``'N'``;
* opset-9 operator forms: Dropout with ``ratio``, BatchNormalization with five
  inputs and no ``spatial``, Gemm with ``transB=1`` and a required ``C``,
  Reshape whose shape is an int64 initializer, pools without ``ceil_mode``
  (the Caffe ceil rounding is written as asymmetric pads instead);
* ResNet-50's residual joins are ``Sum`` in stages 1-2 and ``Add`` in 3-4.

Channel widths and layer counts are the real networks'.  By default the models
are *shape-only*: every float weight is a ``TensorProto`` with dims and dtype set
whose data lives in an external file ``<model>.weights.bin`` that does not exist
(``data_location = EXTERNAL``), so the protos stay a few tens of KB.  Load such a
model from disk with ``onnx.load(path, load_external_data=False)``.  The int64
shape constants of Reshape always hold real data.  With ``with_weights=True``
the weights are small seeded random float32 values, so onnxruntime can run
the model (only sensible for the small ones: alexnet, squeezenet1_1,
shufflenet, inception_v1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unity_cli.zoo.net import external_ref

OPSET = 9
IR_VERSION = 4
BATCH = "N"


class _Builder:
    def __init__(self, name: str, with_weights: bool, seed: int = 0,
                 producer: str = "onnx-caffe2"):
        self.name = name
        self.with_weights = with_weights
        self.rng = np.random.default_rng(seed)
        self.producer = producer
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.init_inputs: list[onnx.ValueInfoProto] = []
        self._offset = 0
        self._n = 0

    # -- helpers ---------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def weight(self, name: str, dims: Sequence[int], kind: str = "normal",
               fan_in: int = 1) -> str:
        """A float32 initializer (external / shape-only unless with_weights)."""
        dims = [int(d) for d in dims]
        if self.with_weights:
            lo, hi = {"bias": (-0.05, 0.05), "scale": (0.4, 0.8), "mean": (-0.05, 0.05),
                      "var": (0.8, 1.2)}.get(kind, (0.0, 0.0))
            if kind == "normal":
                arr = self.rng.standard_normal(dims, dtype=np.float32)
                arr *= np.float32(np.sqrt(2.0 / max(fan_in, 1)))
            else:
                arr = self.rng.random(dims, dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)
            t = numpy_helper.from_array(arr.astype(np.float32), name)
        else:
            t = external_ref(name, dims, f"{self.name}.weights.bin", self._offset)
            nbytes = int(np.prod(dims, dtype=np.int64)) * 4
            self._offset += (nbytes + 4095) // 4096 * 4096
        self.inits.append(t)
        self.init_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        return name

    def int64_const(self, name: str, values: Sequence[int]) -> str:
        """An int64 initializer that always holds data (e.g. a Reshape shape)."""
        arr = np.asarray(values, dtype=np.int64)
        self.inits.append(numpy_helper.from_array(arr, name))
        self.init_inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, arr.shape))
        return name

    def node(self, op: str, inputs: Sequence[str], name: str,
             n_out: int = 1, **attrs) -> str:
        outs = [name] + [f"{name}_{i}" for i in range(1, n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0]

    # -- layers ----------------------------------------------------------
    def conv(self, x: str, cin: int, cout: int, k: int, name: str, stride: int = 1,
             pad: int | None = None, group: int = 1, bias: bool = True) -> str:
        if pad is None:
            pad = k // 2
        w = self.weight(f"{name}_w", [cout, cin // group, k, k], fan_in=cin // group * k * k)
        ins = [x, w]
        if bias:
            ins.append(self.weight(f"{name}_b", [cout], "bias"))
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                     dilations=[1, 1])
        if group != 1:
            attrs["group"] = group
        return self.node("Conv", ins, name, **attrs)

    def bn(self, x: str, c: int, name: str, eps: float = 1e-5) -> str:
        ins = [x, self.weight(f"{name}_scale", [c], "scale"),
               self.weight(f"{name}_bias", [c], "bias"),
               self.weight(f"{name}_mean", [c], "mean"),
               self.weight(f"{name}_var", [c], "var")]
        return self.node("BatchNormalization", ins, name, epsilon=eps, momentum=0.9)

    def relu(self, x: str, name: str | None = None) -> str:
        return self.node("Relu", [x], name or f"{x}_relu")

    def maxpool(self, x: str, k: int, s: int, name: str,
                pads: Sequence[int] = (0, 0, 0, 0)) -> str:
        return self.node("MaxPool", [x], name, kernel_shape=[k, k], strides=[s, s],
                         pads=list(pads))

    def avgpool(self, x: str, k: int, s: int, name: str,
                pads: Sequence[int] = (0, 0, 0, 0)) -> str:
        return self.node("AveragePool", [x], name, kernel_shape=[k, k], strides=[s, s],
                         pads=list(pads))

    def lrn(self, x: str, name: str) -> str:
        return self.node("LRN", [x], name, size=5, alpha=1e-4, beta=0.75, bias=1.0)

    def dropout(self, x: str, name: str, ratio: float = 0.5, with_mask: bool = False) -> str:
        return self.node("Dropout", [x], name, n_out=2 if with_mask else 1, ratio=ratio)

    def gemm(self, x: str, cin: int, cout: int, name: str) -> str:
        w = self.weight(f"{name}_w", [cout, cin], fan_in=cin)
        b = self.weight(f"{name}_b", [cout], "bias")
        return self.node("Gemm", [x, w, b], name, alpha=1.0, beta=1.0, transB=1)

    def concat(self, xs: Sequence[str], name: str) -> str:
        return self.node("Concat", list(xs), name, axis=1)

    def flatten(self, x: str, name: str) -> str:
        return self.node("Flatten", [x], name, axis=1)

    def reshape(self, x: str, shape: Sequence[int], name: str) -> str:
        return self.node("Reshape", [x, self.int64_const(f"{name}_shape", shape)], name)

    def softmax(self, x: str, name: str = "prob") -> str:
        return self.node("Softmax", [x], name, axis=1)

    # -- finish ----------------------------------------------------------
    def model(self, out: str, doc: str) -> onnx.ModelProto:
        data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [BATCH, 3, 224, 224])
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [BATCH, 1000])
        graph = helper.make_graph(self.nodes, self.name, [data] + self.init_inputs, [y],
                                  initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=self.producer, producer_version="1.4",
                              doc_string=doc)
        m.ir_version = IR_VERSION
        return m


# ---------------------------------------------------------------------------
def alexnet(with_weights: bool = False) -> onnx.ModelProto:
    """BVLC AlexNet: grouped convs, LRN, Reshape to 9216, 3 FC with Dropout."""
    b = _Builder("alexnet", with_weights, seed=1)
    x = b.relu(b.conv("data", 3, 96, 11, "conv1", stride=4, pad=2), "conv1_relu")  # 55
    x = b.maxpool(b.lrn(x, "norm1"), 3, 2, "pool1")                                # 27
    x = b.relu(b.conv(x, 96, 256, 5, "conv2", pad=2, group=2), "conv2_relu")
    x = b.maxpool(b.lrn(x, "norm2"), 3, 2, "pool2")                                # 13
    x = b.relu(b.conv(x, 256, 384, 3, "conv3"), "conv3_relu")
    x = b.relu(b.conv(x, 384, 384, 3, "conv4", group=2), "conv4_relu")
    x = b.relu(b.conv(x, 384, 256, 3, "conv5", group=2), "conv5_relu")
    x = b.maxpool(x, 3, 2, "pool5")                                                # 6
    x = b.reshape(x, [-1, 256 * 6 * 6], "pool5_flat")
    x = b.dropout(b.relu(b.gemm(x, 9216, 4096, "fc6"), "fc6_relu"), "drop6", with_mask=True)
    x = b.dropout(b.relu(b.gemm(x, 4096, 4096, "fc7"), "fc7_relu"), "drop7", with_mask=True)
    x = b.softmax(b.gemm(x, 4096, 1000, "fc8"))
    return b.model(x, "bvlc_alexnet (shape-alike of the ONNX model zoo file)")


def vgg16(with_weights: bool = False) -> onnx.ModelProto:
    """VGG-16 (configuration D): 13 3x3 convs, 5 max pools, 3 FC layers."""
    b = _Builder("vgg16", with_weights, seed=2, producer="pytorch")
    cfg = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
    x, c = "data", 3
    for s, block in enumerate(cfg, 1):
        for i, cout in enumerate(block, 1):
            x = b.relu(b.conv(x, c, cout, 3, f"conv{s}_{i}"), f"relu{s}_{i}")
            c = cout
        x = b.maxpool(x, 2, 2, f"pool{s}")                                        # ... 7
    x = b.flatten(x, "flatten")
    x = b.dropout(b.relu(b.gemm(x, 512 * 7 * 7, 4096, "fc6"), "relu6"), "drop6")
    x = b.dropout(b.relu(b.gemm(x, 4096, 4096, "fc7"), "relu7"), "drop7")
    x = b.softmax(b.gemm(x, 4096, 1000, "fc8"))
    return b.model(x, "vgg16 (shape-alike of the ONNX model zoo file)")


def resnet50(with_weights: bool = False) -> onnx.ModelProto:
    """ResNet-50 v1: 3-4-6-3 bottlenecks, projection shortcuts, BN after every conv.

    Residual joins are ``Sum`` (caffe2 style) in stages 1-2 and ``Add`` in 3-4."""
    b = _Builder("resnet50", with_weights, seed=3)
    x = b.relu(b.bn(b.conv("data", 3, 64, 7, "conv1", stride=2, bias=False), 64, "bn_conv1"))
    x = b.maxpool(x, 3, 2, "pool1", pads=(1, 1, 1, 1))                             # 56
    c = 64
    for stage, (n, mid, out) in enumerate([(3, 64, 256), (4, 128, 512),
                                           (6, 256, 1024), (3, 512, 2048)], 2):
        for i in range(n):
            p = f"res{stage}{chr(ord('a') + i)}"
            stride = 2 if (i == 0 and stage > 2) else 1
            y = b.relu(b.bn(b.conv(x, c, mid, 1, f"{p}_branch2a", stride=stride, bias=False),
                            mid, f"bn{p[3:]}_branch2a"))
            y = b.relu(b.bn(b.conv(y, mid, mid, 3, f"{p}_branch2b", bias=False),
                            mid, f"bn{p[3:]}_branch2b"))
            y = b.bn(b.conv(y, mid, out, 1, f"{p}_branch2c", bias=False), out, f"bn{p[3:]}_branch2c")
            if i == 0:
                sc = b.bn(b.conv(x, c, out, 1, f"{p}_branch1", stride=stride, bias=False),
                          out, f"bn{p[3:]}_branch1")
            else:
                sc = x
            join = "Sum" if stage <= 3 else "Add"
            x = b.relu(b.node(join, [sc, y], p), f"{p}_relu")
            c = out
    x = b.flatten(b.node("GlobalAveragePool", [x], "pool5"), "pool5_flatten")
    x = b.softmax(b.gemm(x, 2048, 1000, "fc1000"))
    return b.model(x, "resnet50 v1 (shape-alike of the ONNX model zoo file)")


_INCEPTION_V1 = [  # name, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj
    ("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64), "pool",
    ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64),
    ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64),
    ("4e", 256, 160, 320, 32, 128, 128), "pool",
    ("5a", 256, 160, 320, 32, 128, 128), ("5b", 384, 192, 384, 48, 128, 128),
]


def inception_v1(with_weights: bool = False) -> onnx.ModelProto:
    """GoogLeNet / Inception v1 (BVLC): nine 4-branch inception modules, LRN."""
    b = _Builder("inception_v1", with_weights, seed=4)
    ceil_pads = (0, 0, 1, 1)  # Caffe ceil_mode rounding written as end padding
    x = b.relu(b.conv("data", 3, 64, 7, "conv1_7x7_s2", stride=2), "conv1_relu")  # 112
    x = b.lrn(b.maxpool(x, 3, 2, "pool1_3x3_s2", pads=ceil_pads), "pool1_norm1")  # 56
    x = b.relu(b.conv(x, 64, 64, 1, "conv2_3x3_reduce"), "conv2_reduce_relu")
    x = b.relu(b.conv(x, 64, 192, 3, "conv2_3x3"), "conv2_relu")
    x = b.maxpool(b.lrn(x, "conv2_norm2"), 3, 2, "pool2_3x3_s2", pads=ceil_pads)  # 28
    c, pools = 192, 3
    for spec in _INCEPTION_V1:
        if spec == "pool":
            x = b.maxpool(x, 3, 2, f"pool{pools}_3x3_s2", pads=ceil_pads)
            pools += 1
            continue
        n, c1, r3, c3, r5, c5, pp = spec
        p = f"inception_{n}"
        b1 = b.relu(b.conv(x, c, c1, 1, f"{p}_1x1"), f"{p}_relu_1x1")
        b2 = b.relu(b.conv(x, c, r3, 1, f"{p}_3x3_reduce"), f"{p}_relu_3x3_reduce")
        b2 = b.relu(b.conv(b2, r3, c3, 3, f"{p}_3x3"), f"{p}_relu_3x3")
        b3 = b.relu(b.conv(x, c, r5, 1, f"{p}_5x5_reduce"), f"{p}_relu_5x5_reduce")
        b3 = b.relu(b.conv(b3, r5, c5, 5, f"{p}_5x5"), f"{p}_relu_5x5")
        b4 = b.maxpool(x, 3, 1, f"{p}_pool", pads=(1, 1, 1, 1))
        b4 = b.relu(b.conv(b4, c, pp, 1, f"{p}_pool_proj"), f"{p}_relu_pool_proj")
        x = b.concat([b1, b2, b3, b4], f"{p}_output")
        c = c1 + c3 + c5 + pp
    x = b.avgpool(x, 7, 1, "pool5_7x7_s1")                                         # 1x1
    x = b.dropout(x, "pool5_drop_7x7_s1", ratio=0.4)
    x = b.reshape(x, [0, -1], "pool5_flat")
    x = b.softmax(b.gemm(x, 1024, 1000, "loss3_classifier"))
    return b.model(x, "bvlc_googlenet / inception_v1 (shape-alike of the ONNX model zoo file)")


def densenet121(with_weights: bool = False) -> onnx.ModelProto:
    """DenseNet-121: dense blocks 6-12-24-16 (growth 32, bottleneck 4x) joined with
    Concat, transition layers BN-ReLU-1x1 conv-AvgPool halving the channels."""
    b = _Builder("densenet121", with_weights, seed=5, producer="pytorch")
    x = b.relu(b.bn(b.conv("data", 3, 64, 7, "conv0", stride=2, bias=False), 64, "norm0"))
    x = b.maxpool(x, 3, 2, "pool0", pads=(1, 1, 1, 1))                             # 56
    c, growth = 64, 32
    for blk, n in enumerate([6, 12, 24, 16], 1):
        for i in range(1, n + 1):
            p = f"denseblock{blk}_layer{i}"
            y = b.relu(b.bn(x, c, f"{p}_norm1"))
            y = b.conv(y, c, 4 * growth, 1, f"{p}_conv1", bias=False)
            y = b.relu(b.bn(y, 4 * growth, f"{p}_norm2"))
            y = b.conv(y, 4 * growth, growth, 3, f"{p}_conv2", bias=False)
            x = b.concat([x, y], f"{p}_concat")
            c += growth
        if blk < 4:
            p = f"transition{blk}"
            y = b.relu(b.bn(x, c, f"{p}_norm"))
            y = b.conv(y, c, c // 2, 1, f"{p}_conv", bias=False)
            x = b.avgpool(y, 2, 2, f"{p}_pool")
            c //= 2
    x = b.relu(b.bn(x, c, "norm5"))
    x = b.flatten(b.node("GlobalAveragePool", [x], "pool5"), "pool5_flatten")
    x = b.softmax(b.gemm(x, c, 1000, "classifier"))
    return b.model(x, "densenet121 (shape-alike of the ONNX model zoo file)")


def squeezenet1_1(with_weights: bool = False) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (squeeze 1x1, expand 1x1 || 3x3, Concat)."""
    b = _Builder("squeezenet1_1", with_weights, seed=6)
    ceil_pads = (0, 0, 1, 1)
    x = b.relu(b.conv("data", 3, 64, 3, "conv1", stride=2, pad=0), "relu_conv1")  # 111
    x = b.maxpool(x, 3, 2, "pool1", pads=ceil_pads)                               # 55
    c = 64
    fires = [(2, 16, 64), (3, 16, 64), "pool3", (4, 32, 128), (5, 32, 128), "pool5",
             (6, 48, 192), (7, 48, 192), (8, 64, 256), (9, 64, 256)]
    for f in fires:
        if isinstance(f, str):
            x = b.maxpool(x, 3, 2, f, pads=ceil_pads)
            continue
        i, sq, ex = f
        p = f"fire{i}"
        s = b.relu(b.conv(x, c, sq, 1, f"{p}_squeeze1x1"), f"{p}_relu_squeeze1x1")
        e1 = b.relu(b.conv(s, sq, ex, 1, f"{p}_expand1x1"), f"{p}_relu_expand1x1")
        e3 = b.relu(b.conv(s, sq, ex, 3, f"{p}_expand3x3"), f"{p}_relu_expand3x3")
        x = b.concat([e1, e3], f"{p}_concat")
        c = 2 * ex
    x = b.dropout(x, "drop9", ratio=0.5)
    x = b.relu(b.conv(x, c, 1000, 1, "conv10"), "relu_conv10")
    x = b.flatten(b.node("GlobalAveragePool", [x], "pool10"), "pool10_flatten")
    x = b.softmax(x, "softmaxout_1")
    return b.model(x, "squeezenet1.1 (shape-alike of the ONNX model zoo file)")


def shufflenet(with_weights: bool = False) -> onnx.ModelProto:
    """ShuffleNet v1, g=3 (240/480/960 channels, 4-8-4 units): grouped 1x1 convs,
    channel shuffle as Reshape -> Transpose -> Reshape, depthwise 3x3, BN;
    stride-2 units Concat an AvgPool shortcut, stride-1 units Add the input."""
    b = _Builder("shufflenet", with_weights, seed=7)
    g = 3
    x = b.relu(b.bn(b.conv("data", 3, 24, 3, "conv1", stride=2, bias=False), 24, "conv1_bn"))
    x = b.maxpool(x, 3, 2, "pool1", pads=(1, 1, 1, 1))                             # 56
    c, hw = 24, 56
    for stage, (out, n) in enumerate([(240, 4), (480, 8), (960, 4)], 2):
        for i in range(n):
            p = f"stage{stage}_unit{i + 1}"
            stride = 2 if i == 0 else 1
            mid = out // 4
            out_hw = hw // stride
            branch_out = out - c if stride == 2 else out
            g1 = 1 if (stage == 2 and i == 0) else g
            y = b.conv(x, c, mid, 1, f"{p}_gconv1", group=g1, bias=False)
            y = b.relu(b.bn(y, mid, f"{p}_bn1"))
            # channel shuffle
            y = b.reshape(y, [0, g, mid // g, hw, hw], f"{p}_shuffle_reshape1")
            y = b.node("Transpose", [y], f"{p}_shuffle_transpose", perm=[0, 2, 1, 3, 4])
            y = b.reshape(y, [0, mid, hw, hw], f"{p}_shuffle_reshape2")
            y = b.bn(b.conv(y, mid, mid, 3, f"{p}_dwconv", stride=stride, group=mid, bias=False),
                     mid, f"{p}_bn2")
            y = b.bn(b.conv(y, mid, branch_out, 1, f"{p}_gconv2", group=g, bias=False),
                     branch_out, f"{p}_bn3")
            if stride == 2:
                sc = b.avgpool(x, 3, 2, f"{p}_shortcut_pool", pads=(1, 1, 1, 1))
                x = b.concat([sc, y], f"{p}_concat")
            else:
                x = b.node("Add", [x, y], f"{p}_add")
            x = b.relu(x, f"{p}_relu")
            c, hw = out, out_hw
    x = b.flatten(b.node("GlobalAveragePool", [x], "pool_global"), "pool_flatten")
    x = b.softmax(b.gemm(x, c, 1000, "fc"), "softmax")
    return b.model(x, "shufflenet v1 g=3 (shape-alike of the ONNX model zoo file)")


ZOO9: dict[str, Callable[..., onnx.ModelProto]] = {
    "alexnet": alexnet,
    "resnet50": resnet50,
    "inception_v1": inception_v1,
    "densenet121": densenet121,
    "squeezenet1_1": squeezenet1_1,
    "vgg16": vgg16,
    "shufflenet": shufflenet,
}

# Small enough (in parameters and FLOPs) to build with weights and run quickly.
RUNNABLE = ("alexnet", "squeezenet1_1", "shufflenet", "inception_v1")


def weights_file_size(model: onnx.ModelProto) -> int:
    """Bytes the (absent) external weights file of a shape-only model would hold."""
    end = 0
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            kv = {e.key: e.value for e in t.external_data}
            end = max(end, int(kv.get("offset", 0)) + int(kv.get("length", 0)))
    return end


def check(model: onnx.ModelProto, full_check: bool = False) -> None:
    """``onnx.checker.check_model`` for zoo9 models, shape-only ones included.

    The checker insists that an external-data location is an existing regular
    file, even with ``full_check=False``.  For a shape-only model we therefore
    check it from a temporary folder holding a *sparse* stand-in of the weights
    file (no disk blocks, no data read); models with inline weights are checked
    directly."""
    import os
    import tempfile

    locations = {e.value for t in model.graph.initializer
                 if t.data_location == TensorProto.EXTERNAL
                 for e in t.external_data if e.key == "location"}
    if not locations:
        onnx.checker.check_model(model, full_check=full_check)
        return
    with tempfile.TemporaryDirectory() as d:
        size = weights_file_size(model)
        for loc in locations:
            with open(os.path.join(d, loc), "wb") as f:
                f.truncate(size)
        path = os.path.join(d, "model.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        onnx.checker.check_model(path, full_check=full_check)
