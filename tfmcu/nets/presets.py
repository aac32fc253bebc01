"""Published mobile ImageNet architectures as ``NetSpec`` builders (the baselines of the MCUNetV2 paper, Fig. 5).

Every builder takes ``width`` (global width multiplier, ``NetSpec.width_multiplier``), ``resolution`` and
``num_classes`` and returns a validated spec with TF "same" padding. The architectures are re-expressed from the
reference implementations cited next to each builder (nothing is copied from them); at width 1.0, 224x224 and 1000
classes they are within 3% of the papers' MACs and parameter counts (see ``tests/test_presets.py`` for the figures
and the counting convention).

Spec conventions this file relies on (``tfmcu.nets.spec``):

* an ``expand == 1`` block has no 1x1 expansion conv (depthwise -> SE -> 1x1 linear projection);
* SE hidden channels are ``int(block input channels * se)``, the SE reduce conv uses ReLU (MnasNet / TPU code);
* the shortcut is added whenever stride is 1 and input and output channels match;
* channels are ``make_divisible(c * width, 8)``; the stem is scaled too (Keras MobileNetV2 rule); the head's last
  1x1 conv is scaled only when ``head.scale_last_channels`` and width > 1.

``PRESETS`` maps names to builders; ``get_preset`` looks one up by name. The detector presets (``mbv2-det-w035``,
``mbv2-det2-w035``) put a yolo head (``HeadSpec.yolo``) on a MobileNetV2 backbone.
"""

from __future__ import annotations

import copy
from typing import Callable

from tfmcu.nets.anchors import split_anchors
from tfmcu.nets.spec import BlockSpec, HeadSpec, NetSpec, StageSpec, StemSpec

__all__ = ["PRESETS", "get_preset", "mbv2", "mbv2_rd", "mnasnet_a1", "fbnet_a", "proxyless_mobile", "mbv2_det",
           "mbv2_det2"]


def _repeat(n: int, out: int, kernel: int, expand: float, stride: int, **kw) -> list[BlockSpec]:
    """``n`` identical blocks; only the first one strides (MobileNetV2 / MnasNet stage notation)."""
    return [BlockSpec(out_channels=out, kernel=kernel, expand=expand, stride=stride if i == 0 else 1, **kw)
            for i in range(n)]


def _net(name: str, width: float, resolution: int, stem: StemSpec, stages: list[list[BlockSpec]],
         head: HeadSpec) -> NetSpec:
    spec = NetSpec(name=name, resolution=resolution, width_multiplier=width, padding="same", stem=stem,
                   stages=[StageSpec(blocks) for blocks in stages], head=head)
    return spec.validate()


# ---------------------------------------------------------------------------------------------------- MobileNetV2
def mbv2(width: float = 1.0, resolution: int = 224, num_classes: int = 1000) -> NetSpec:
    """MobileNetV2 (Sandler et al., CVPR 2018, Table 2), with Keras applications' width rounding.

    Source: the paper's Table 2 (t, c, n, s) and keras-team/keras ``keras/applications/mobilenet_v2.py``:
    stem ``make_divisible(32 * alpha, 8)``, block outputs ``make_divisible(c * alpha, 8)``, first block t = 1,
    ReLU6, last 1x1 conv 1280 scaled only when alpha > 1.
    Published: 1.0 @ 224: 300M MACs, 3.4M params; 0.35 @ 224: 59M MACs, 1.7M params.
    """
    return _mbv2_backbone("mbv2", width, resolution,
                          HeadSpec(last_channels=1280, num_classes=num_classes, scale_last_channels=True,
                                   activation="relu6"))


def _mbv2_backbone(name: str, width: float, resolution: int, head: HeadSpec) -> NetSpec:
    act = "relu6"
    stages = [  # (n, c, k, t, s) from the paper's Table 2
        _repeat(1, 16, 3, 1, 1, activation=act),
        _repeat(2, 24, 3, 6, 2, activation=act),
        _repeat(3, 32, 3, 6, 2, activation=act),
        _repeat(4, 64, 3, 6, 2, activation=act),
        _repeat(3, 96, 3, 6, 1, activation=act),
        _repeat(3, 160, 3, 6, 2, activation=act),
        _repeat(1, 320, 3, 6, 1, activation=act),
    ]
    return _net(name, width, resolution, StemSpec(out_channels=32, kernel=3, stride=2, activation=act), stages, head)


# ---------------------------------------------------------------------------------------------------- detectors
# Default anchors (w, h as fractions of the input): square, spaced geometrically. One scale: 10, 16 and 24 px at
# 160 px, the object sizes of tfmcu.data.scenes' default (10-24 px). Two scales: six sizes from 10 to 80 px at 160 px,
# the three smallest on the stride-16 scale. Fit them to a data set's boxes with tfmcu.nets.anchors.kmeans_anchors.
DET_ANCHORS: list[list[list[float]]] = [[[0.0625, 0.0625], [0.1, 0.1], [0.15, 0.15]]]
DET2_ANCHORS: list[list[list[float]]] = split_anchors(
    [[s, s] for s in (0.0625, 0.095, 0.144, 0.218, 0.33, 0.5)], 2)
DET_HEAD_CHANNELS = 128  # the 1x1 conv + ReLU6 before each prediction conv


def mbv2_det(width: float = 0.35, resolution: int = 160, num_classes: int = 10,
             anchors: list[list[list[float]]] | None = None) -> NetSpec:
    """A small detector (ours): the MobileNetV2 backbone (``mbv2`` without its classification head) and a
    one-scale yolo head on the stride-32 output (5x5 at 160 px), 3 anchors (``DET_ANCHORS`` unless given)."""
    head = HeadSpec.yolo(num_classes, copy.deepcopy(DET_ANCHORS if anchors is None else anchors), DET_HEAD_CHANNELS)
    return _mbv2_backbone("mbv2-det-w035", width, resolution, head)


def mbv2_det2(width: float = 0.35, resolution: int = 160, num_classes: int = 10,
              anchors: list[list[list[float]]] | None = None) -> NetSpec:
    """``mbv2_det`` with a second scale on block 13's stride-16 output (10x10 at 160 px); 3 anchors per scale
    (``DET2_ANCHORS`` unless given). Outputs: [stride 32, stride 16]."""
    head = HeadSpec.yolo(num_classes, copy.deepcopy(DET2_ANCHORS if anchors is None else anchors),
                         DET_HEAD_CHANNELS)
    return _mbv2_backbone("mbv2-det2-w035", width, resolution, head)


def mbv2_rd(width: float = 1.0, resolution: int = 224, num_classes: int = 1000) -> NetSpec:
    """MbV2-RD: MobileNetV2 with its receptive field redistributed for patch-based inference (MCUNetV2 Sec. 3.2).

    Why: with 4x4 patches over the first 5 blocks (output 28x28, stride 8) plain MobileNetV2's patch stage has a
    receptive field of 27 pixels, so each 7x7 output patch needs a 75x75 input patch and the overlapping halos cost
    +42% MACs in the stage (+13% overall, padded accounting). The halo grows with every spatial kernel the stage
    holds, weighted by its stride: RF = 1 + sum((k - 1) * jump).

    Design (ours; the paper gives the idea and the targets, not the layer table):
    * patch stage = stem + 2 blocks only, each with one 3x3 kernel and stride 2 (224 -> 112 -> 56 -> 28), so the
      stage still ends at stride 8 with a 28x28x32 output but its receptive field is the minimum for three 3x3
      stride-2 layers, 1 + 2 + 4 + 8 = 15: a 7x7 output patch needs a 63x63 input patch;
    * the stride-1 blocks MobileNetV2 runs at 112x112 (block 1, t=1) and 56x56 (block 3) are removed from the
      high-resolution stage; the stem is narrowed to 24 channels and the two stage blocks use expansions 3 and 4,
      which keeps the stage cheap (about 16% of the MACs);
    * the receptive field and capacity are given back to the per-layer stage: one more block at 32, 64 and 96
      channels (4, 5 and 4 blocks instead of 3, 4 and 3).
    Result at 224 with 4x4 patches over the first 3 blocks: input patch 63x63, patch-stage MAC overhead +19%,
    overall +3% (padded accounting), about 301M MACs in total, the same 28x28x32 stage output as MobileNetV2 n=5.
    The paper's MbV2-RD: 63x63, +18% stage, +3% overall, ~301M MACs, same ImageNet accuracy as MobileNetV2.
    """
    act = "relu6"
    stages = [
        _repeat(1, 24, 3, 3, 2, activation=act),  # patch stage: 112 -> 56
        _repeat(1, 32, 3, 4, 2, activation=act),  # patch stage: 56 -> 28 (stage output 28x28x32)
        _repeat(3, 32, 3, 6, 1, activation=act),  # per-layer stage from here (MobileNetV2: 2 blocks)
        _repeat(5, 64, 3, 6, 2, activation=act),  # (4)
        _repeat(4, 96, 3, 6, 1, activation=act),  # (3)
        _repeat(3, 160, 3, 6, 2, activation=act),
        _repeat(1, 320, 3, 6, 1, activation=act),
    ]
    spec = _net("mbv2-rd", width, resolution, StemSpec(out_channels=24, kernel=3, stride=2, activation=act),
                stages, HeadSpec(last_channels=1280, num_classes=num_classes, scale_last_channels=True,
                                 activation=act))
    return spec


# ---------------------------------------------------------------------------------------------------- MnasNet-A1
def mnasnet_a1(width: float = 1.0, resolution: int = 224, num_classes: int = 1000) -> NetSpec:
    """MnasNet-A1 (Tan et al., CVPR 2019, Fig. 7).

    Source: tensorflow/tpu ``models/official/mnasnet/mnasnet_models.py`` (``mnasnet_a1`` block strings) and
    ``mnasnet_model.py`` (stem 32, ReLU everywhere, SE hidden = int(block input filters * 0.25), head conv 1280 not
    width-scaled). The first block is the SepConv (depthwise 3x3 + linear 1x1 to 16, no skip).
    Published: 312M MACs, 3.9M params.
    """
    act = "relu"
    stages = [  # (repeats, out, kernel, expand, stride, se)
        _repeat(1, 16, 3, 1, 1, activation=act, residual=False),  # SepConv, 'noskip'
        _repeat(2, 24, 3, 6, 2, activation=act),
        _repeat(3, 40, 5, 3, 2, se=0.25, activation=act),
        _repeat(4, 80, 3, 6, 2, activation=act),
        _repeat(2, 112, 3, 6, 1, se=0.25, activation=act),
        _repeat(3, 160, 5, 6, 2, se=0.25, activation=act),
        _repeat(1, 320, 3, 6, 1, activation=act),
    ]
    return _net("mnasnet-a1", width, resolution, StemSpec(out_channels=32, kernel=3, stride=2, activation=act),
                stages, HeadSpec(last_channels=1280, num_classes=num_classes, scale_last_channels=False,
                                 activation=act))


# ---------------------------------------------------------------------------------------------------- FBNet-A
def fbnet_a(width: float = 1.0, resolution: int = 224, num_classes: int = 1000) -> NetSpec:
    """FBNet-A (Wu et al., CVPR 2019, Fig. 4 / Table 2).

    Source: facebookresearch/mobile-vision ``mobile_cv/arch/fbnet_v2/fbnet_modeldef_cls_fbnet.py`` ("fbnet_a") with
    the block semantics of ``mobile_cv/arch/fbnet_v2/irf_block.py``: stem 3x3/16, ReLU, ``skip`` ops omitted (they
    are identities: same channels, stride 1), ``_g2`` blocks use 2 groups in the 1x1 convs (channel shuffle is free
    and not modelled), an e1 block has no 1x1 expansion conv, last 1x1 conv 1504.
    Published: 249M MACs, 4.3M params. (The paper's 249M also counts a 1x1 conv in front of the depthwise in the
    five e1 blocks, as the original maskrcnn-benchmark IRFBlock had; the spec cannot express that conv, so this
    preset is the mobile-vision definition: 5.5M MACs / 16k params less, see tests/test_presets.py.)
    """
    act = "relu"

    def b(out: int, kernel: int, expand: float, stride: int = 1, groups: int = 1) -> BlockSpec:
        return BlockSpec(out_channels=out, kernel=kernel, expand=expand, stride=stride, groups=groups,
                         activation=act)

    stages = [
        # stage 1: a single 'skip' (16 -> 16, stride 1) -> omitted
        [b(24, 3, 3, 2), b(24, 3, 1)],  # + two 'skip' ops, omitted
        [b(32, 5, 6, 2), b(32, 3, 3), b(32, 5, 1), b(32, 3, 3)],
        [b(64, 5, 6, 2), b(64, 5, 3), b(64, 5, 1, groups=2), b(64, 5, 6),
         b(112, 3, 6), b(112, 5, 1, groups=2), b(112, 5, 3), b(112, 3, 1, groups=2)],
        [b(184, 5, 6, 2), b(184, 5, 6), b(184, 5, 3), b(184, 5, 6), b(352, 5, 6)],
    ]
    return _net("fbnet-a", width, resolution, StemSpec(out_channels=16, kernel=3, stride=2, activation=act), stages,
                HeadSpec(last_channels=1504, num_classes=num_classes, scale_last_channels=False, activation=act))


# ---------------------------------------------------------------------------------------------------- ProxylessNAS
def proxyless_mobile(width: float = 1.0, resolution: int = 224, num_classes: int = 1000) -> NetSpec:
    """ProxylessNAS-Mobile (Cai et al., ICLR 2019, Fig. 4 "mobile" / Table 2).

    Source: the released ``proxyless_mobile.config`` (mit-han-lab/proxylessnas model zoo), as transcribed in
    osmr/imgclsmob ``pytorch/pytorchcv/models/proxylessnas.py`` (version 'mobile'; its self-test pins 4,080,512
    parameters). Stem 3x3/32, ReLU6, first block MBConv e1 k3 -> 16, zero (skipped) blocks omitted, last 1x1 conv
    1280 (scaled only when width > 1, like proxyless_mobile_14's 1792).
    Published: 320M MACs, 4.1M params.
    """
    act = "relu6"

    def b(out: int, kernel: int, expand: float, stride: int = 1, first: bool = False) -> BlockSpec:
        # The config gives the first block of every stage no shortcut (matters only if rounding equalises channels).
        return BlockSpec(out_channels=out, kernel=kernel, expand=expand, stride=stride, activation=act,
                         residual=not first)

    stages = [
        [b(16, 3, 1, first=True)],
        [b(32, 5, 3, 2, first=True), b(32, 3, 3)],  # + two zero blocks, omitted
        [b(40, 7, 3, 2, first=True), b(40, 3, 3), b(40, 5, 3), b(40, 5, 3)],
        [b(80, 7, 6, 2, first=True), b(80, 5, 3), b(80, 5, 3), b(80, 5, 3)],
        [b(96, 5, 6, first=True), b(96, 5, 3), b(96, 5, 3), b(96, 5, 3)],
        [b(192, 7, 6, 2, first=True), b(192, 7, 6), b(192, 7, 3), b(192, 7, 3)],
        [b(320, 7, 6, first=True)],
    ]
    return _net("proxyless-mobile", width, resolution, StemSpec(out_channels=32, kernel=3, stride=2, activation=act),
                stages, HeadSpec(last_channels=1280, num_classes=num_classes, scale_last_channels=True,
                                 activation=act))


# ---------------------------------------------------------------------------------------------------- registry
# OFA-CPU (MCUNetV2 Fig. 5) is deliberately absent: its net.config is only hosted on the OFA model-zoo server, and
# the paper does not say which of the four cpu_lat@{10,11,15,17}ms nets it profiled, so it cannot be pinned down.
PRESETS: dict[str, Callable[..., NetSpec]] = {
    "mbv2": mbv2,
    "mnasnet-a1": mnasnet_a1,
    "fbnet-a": fbnet_a,
    "proxyless-mobile": proxyless_mobile,
    "mbv2-rd": mbv2_rd,
    "mbv2-det-w035": mbv2_det,
    "mbv2-det2-w035": mbv2_det2,
}


def get_preset(name: str, resolution: int | None = None, width: float | None = None,
               num_classes: int | None = None) -> NetSpec:
    """The preset ``name`` (e.g. "mbv2"); arguments left as None keep the builder's defaults (224, 1.0, 1000 for
    the classifiers).

    Raises ``ValueError`` naming the known presets when ``name`` is unknown, and ``SpecError`` (a ValueError)
    when the arguments give an invalid network.
    """
    builder = PRESETS.get(name) if isinstance(name, str) else None
    if builder is None:
        raise ValueError(f"unknown preset '{name}'; known presets: {', '.join(PRESETS)}")
    kwargs: dict[str, float | int] = {}
    if resolution is not None:
        kwargs["resolution"] = resolution
    if width is not None:
        kwargs["width"] = width
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return builder(**kwargs)


# ---------------------------------------------------------------------------------------------------- demo net
def mcunet_demo(width: float = 1.0, resolution: int = 96, num_classes: int = 10) -> NetSpec:
    """A small MCUNet-style net for ``make demo`` (ours): 96x96 input, ~20M MACs, ~0.2M params.

    MnasNet-like inverted residual blocks with 3x3 / 5x5 kernels and expansion 1-6, no last 1x1 conv (the pooled
    features go straight to the classifier, as in MCUNet). Like every such net its activation memory is
    concentrated at the front: at 96x96 the per-layer peak is block 2's 6x expansion at 48x48 (270 kB analytic,
    ~300 kB of TFLM arena), while everything from 24x24 on needs about a third of it -- which is what patch-based
    inference of the first blocks removes (``make demo``: a 0.6x budget is met with 1x3 patches over 3 blocks).
    """
    act = "relu6"
    b = BlockSpec
    stages = [
        [b(16, 3, 1, 1, activation=act)],
        [b(24, 3, 6, 2, activation=act), b(24, 3, 3, 1, activation=act)],
        [b(40, 5, 4, 2, activation=act), b(40, 3, 4, 1, activation=act)],
        [b(80, 3, 4, 2, activation=act), b(80, 5, 4, 1, activation=act), b(96, 3, 4, 1, activation=act)],
    ]
    return _net("mcunet-demo", width, resolution, StemSpec(out_channels=16, kernel=3, stride=2, activation=act),
                stages, HeadSpec(last_channels=0, num_classes=num_classes, activation=act))


PRESETS["mcunet-demo"] = mcunet_demo
