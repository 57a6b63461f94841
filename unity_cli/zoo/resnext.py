"""ResNeXt (Xie et al., CVPR'17), as torchvision's ``resnext50_32x4d``: bottleneck blocks
whose 3x3 conv is grouped (cardinality 32, 4 channels per group at the first stage),
BN after every conv, projection shortcuts, global average pool, one FC layer."""
from __future__ import annotations

from dataclasses import dataclass

from .layers import conv_bn, linear
from .net import Net


@dataclass(frozen=True, slots=True)
class ResNeXtConfig:
    blocks: tuple[int, ...]      # bottleneck blocks per stage
    widths: tuple[int, ...]      # grouped-conv width per stage (groups * width per group)
    outs: tuple[int, ...]        # block output channels per stage
    groups: int
    stem: int
    image: int
    classes: int


PAPER = ResNeXtConfig((3, 4, 6, 3), (128, 256, 512, 1024), (256, 512, 1024, 2048), 32, 64, 224, 1000)
SMALL = ResNeXtConfig((1, 1, 1, 1), (8, 16, 32, 64), (16, 32, 64, 128), 4, 8, 32, 10)


def build(net: Net, cfg: ResNeXtConfig, batch: int | str) -> str:
    x = net.input("x", [batch, 3, cfg.image, cfg.image])
    x = conv_bn(net, x, 3, cfg.stem, 7, "stem", stride=2, pad=3)
    x = net.node("MaxPool", [x], "stem.maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = cfg.stem
    for s, (n, width, out) in enumerate(zip(cfg.blocks, cfg.widths, cfg.outs), 1):
        for b in range(n):
            p = f"layer{s}.{b}"
            stride = 2 if b == 0 and s > 1 else 1
            y = conv_bn(net, x, c, width, 1, f"{p}.conv1")
            y = conv_bn(net, y, width, width, 3, f"{p}.conv2", stride=stride, group=cfg.groups)
            y = conv_bn(net, y, width, out, 1, f"{p}.conv3", relu=False)
            shortcut = conv_bn(net, x, c, out, 1, f"{p}.downsample", stride=stride, relu=False) if b == 0 else x
            x = net.node("Relu", [net.node("Add", [y, shortcut], f"{p}.add")], f"{p}.relu")
            c = out
    x = net.node("GlobalAveragePool", [x], "avgpool")
    x = net.node("Flatten", [x], "flatten", axis=1)
    net.output(linear(net, x, c, cfg.classes, "fc"), [batch, cfg.classes])
    return (f"ResNeXt-{2 + 3 * sum(cfg.blocks)} {cfg.groups}x{cfg.widths[0] // cfg.groups}d, "
            f"{cfg.image}x{cfg.image} images, {cfg.classes} classes")
