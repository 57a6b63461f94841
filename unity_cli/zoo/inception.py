"""Inception-v3 (Szegedy et al., CVPR'16), module for module as torchvision's
``inception_v3`` without the auxiliary head: the stem, three Inception-A modules, the
grid reduction B, four Inception-C modules with factorized 1x7 / 7x1 convolutions, the
reduction D, and two Inception-E modules with split 1x3 / 3x1 branches, each branch a
Conv-BN-ReLU chain and the branches concatenated on channels; 299x299 inputs.

The small scale keeps every module kind (one of each) with channels divided by ``div``
on a 75x75 image, the smallest Inception-v3 accepts."""
from __future__ import annotations

from dataclasses import dataclass

from .layers import conv_bn, linear
from .net import Net


@dataclass(frozen=True, slots=True)
class InceptionConfig:
    image: int
    div: int                     # every channel count is divided by this
    a_pool: tuple[int, ...]      # Inception-A modules: the pool branch's channels
    c7: tuple[int, ...]          # Inception-C modules: the 7x7 branches' inner channels
    e_modules: int               # Inception-E modules
    classes: int


PAPER = InceptionConfig(299, 1, (32, 64, 64), (128, 160, 160, 192), 2, 1000)
SMALL = InceptionConfig(75, 16, (32,), (128,), 1, 10)


class _Inception:
    def __init__(self, net: Net, div: int):
        self.net, self.div = net, div

    def ch(self, c: int) -> int:
        return max(1, c // self.div)

    def cbr(self, x: str, cin: int, cout: int, k, name: str, stride: int = 1, pad=0) -> tuple[str, int]:
        """BasicConv2d: Conv (no bias) -> BN (eps 1e-3) -> ReLU; channels already divided."""
        return conv_bn(self.net, x, cin, cout, k, name, stride, pad, eps=1e-3), cout

    def chain(self, x: str, cin: int, convs: list[tuple], name: str) -> tuple[str, int]:
        """A branch: (channels, kernel, stride, pad) per conv, channels before division."""
        c = cin
        for i, (cout, k, stride, pad) in enumerate(convs):
            x, c = self.cbr(x, c, self.ch(cout), k, f"{name}.{i}", stride, pad)
        return x, c

    def avg_pool_branch(self, x: str, cin: int, cout: int, name: str) -> tuple[str, int]:
        p = self.net.node("AveragePool", [x], f"{name}.pool", kernel_shape=[3, 3], strides=[1, 1],
                          pads=[1, 1, 1, 1], count_include_pad=1)
        return self.cbr(p, cin, self.ch(cout), 1, f"{name}.conv")

    def concat(self, branches: list[tuple[str, int]], name: str) -> tuple[str, int]:
        return self.net.node("Concat", [b for b, _ in branches], name, axis=1), sum(c for _, c in branches)

    def max_pool(self, x: str, name: str) -> str:
        return self.net.node("MaxPool", [x], name, kernel_shape=[3, 3], strides=[2, 2])

    # -- modules ---------------------------------------------------------------

    def a(self, x: str, c: int, pool: int, n: str) -> tuple[str, int]:
        return self.concat([
            self.chain(x, c, [(64, 1, 1, 0)], f"{n}.branch1x1"),
            self.chain(x, c, [(48, 1, 1, 0), (64, 5, 1, 2)], f"{n}.branch5x5"),
            self.chain(x, c, [(64, 1, 1, 0), (96, 3, 1, 1), (96, 3, 1, 1)], f"{n}.branch3x3dbl"),
            self.avg_pool_branch(x, c, pool, f"{n}.branch_pool")], n)

    def b(self, x: str, c: int, n: str) -> tuple[str, int]:
        return self.concat([
            self.chain(x, c, [(384, 3, 2, 0)], f"{n}.branch3x3"),
            self.chain(x, c, [(64, 1, 1, 0), (96, 3, 1, 1), (96, 3, 2, 0)], f"{n}.branch3x3dbl"),
            (self.max_pool(x, f"{n}.branch_pool"), c)], n)

    def c(self, x: str, c: int, c7: int, n: str) -> tuple[str, int]:
        def row(cout: int) -> tuple:  # a 1x7 conv
            return (cout, (1, 7), 1, (0, 3))

        def col(cout: int) -> tuple:  # a 7x1 conv
            return (cout, (7, 1), 1, (3, 0))

        return self.concat([
            self.chain(x, c, [(192, 1, 1, 0)], f"{n}.branch1x1"),
            self.chain(x, c, [(c7, 1, 1, 0), row(c7), col(192)], f"{n}.branch7x7"),
            self.chain(x, c, [(c7, 1, 1, 0), col(c7), row(c7), col(c7), row(192)], f"{n}.branch7x7dbl"),
            self.avg_pool_branch(x, c, 192, f"{n}.branch_pool")], n)

    def d(self, x: str, c: int, n: str) -> tuple[str, int]:
        return self.concat([
            self.chain(x, c, [(192, 1, 1, 0), (320, 3, 2, 0)], f"{n}.branch3x3"),
            self.chain(x, c, [(192, 1, 1, 0), (192, (1, 7), 1, (0, 3)), (192, (7, 1), 1, (3, 0)), (192, 3, 2, 0)],
                       f"{n}.branch7x7x3"),
            (self.max_pool(x, f"{n}.branch_pool"), c)], n)

    def e(self, x: str, c: int, n: str) -> tuple[str, int]:
        def split(y: str, cin: int, name: str) -> tuple[str, int]:  # 1x3 and 3x1 side by side
            return self.concat([self.cbr(y, cin, self.ch(384), (1, 3), f"{name}a", pad=(0, 1)),
                                self.cbr(y, cin, self.ch(384), (3, 1), f"{name}b", pad=(1, 0))], f"{name}.cat")

        b3, c3 = self.chain(x, c, [(384, 1, 1, 0)], f"{n}.branch3x3_1")
        b3d, c3d = self.chain(x, c, [(448, 1, 1, 0), (384, 3, 1, 1)], f"{n}.branch3x3dbl_1")
        return self.concat([
            self.chain(x, c, [(320, 1, 1, 0)], f"{n}.branch1x1"),
            split(b3, c3, f"{n}.branch3x3_2"),
            split(b3d, c3d, f"{n}.branch3x3dbl_3"),
            self.avg_pool_branch(x, c, 192, f"{n}.branch_pool")], n)


def build(net: Net, cfg: InceptionConfig, batch: int | str) -> str:
    m = _Inception(net, cfg.div)
    x = net.input("x", [batch, 3, cfg.image, cfg.image])
    x, c = m.chain(x, 3, [(32, 3, 2, 0), (32, 3, 1, 0), (64, 3, 1, 1)], "Conv2d_stem_a")
    x = m.max_pool(x, "maxpool1")
    x, c = m.chain(x, c, [(80, 1, 1, 0), (192, 3, 1, 0)], "Conv2d_stem_b")
    x = m.max_pool(x, "maxpool2")
    for i, pool in enumerate(cfg.a_pool):
        x, c = m.a(x, c, pool, f"Mixed_5{'bcd'[i]}")
    x, c = m.b(x, c, "Mixed_6a")
    for i, c7 in enumerate(cfg.c7):
        x, c = m.c(x, c, c7, f"Mixed_6{'bcde'[i]}")
    x, c = m.d(x, c, "Mixed_7a")
    for i in range(cfg.e_modules):
        x, c = m.e(x, c, f"Mixed_7{'bc'[i]}")
    x = net.node("Flatten", [net.node("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
    net.output(linear(net, x, c, cfg.classes, "fc"), [batch, cfg.classes])
    return (f"Inception-v3: {len(cfg.a_pool)} A, 1 B, {len(cfg.c7)} C, 1 D, {cfg.e_modules} E modules, "
            f"{cfg.image}x{cfg.image} images, {cfg.classes} classes")
