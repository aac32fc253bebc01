"""Searchable block spec: a MnasNet-like network description that round-trips through JSON.

A ``NetSpec`` is plain data. ``tfmcu.graph.from_spec`` lowers it into the graph IR (no TensorFlow needed) and
``tfmcu.nets.keras_builder.build_keras`` builds the same network as a ``tf_keras`` model. Channel counts are
resolved here, once (``resolve``), so both lowerings agree by construction.

Block counting follows the patch scheduler's convention: the stem conv is block 0 and every inverted residual
block is one block; the head is the last block. Two heads (``HeadSpec.type``):

* ``"classify"`` (the default): [last 1x1 conv] -> [global average pool] -> [logits];
* ``"yolo"``: a YOLOv2/v3-style detector on 1 or 2 scales (``detection_scales``). Scale 0 reads the last block's
  output (the network's final output stride: 32 for MobileNetV2-like nets); with 2 scales, scale 1 reads the last
  block at half that stride (16). Per scale: [1x1 conv + activation, ``head_channels``] -> a linear 1x1 conv with
  bias to ``A * (5 + K)`` channels (A anchors, K classes). Channel ``a * (5 + K) + f`` of a cell holds field ``f``
  of anchor ``a``: ``ty, tx, th, tw, obj`` then the K class logits (``YOLO_FIELDS``), all raw. The box fields are
  the centre-size encoding TFLite's DETECTION_POSTPROCESS decodes (``tfmcu.nets.anchors.decode_boxes``). The Keras
  model's and the IR's outputs are ordered by scale, coarsest first (the finest scale, stride 16, is the last
  output); a .tflite names them instead (``tfmcu.nets.keras_builder``).
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any

from tfmcu.errors import TfmcuError

PADDINGS = ("same", "symmetric")
ACTIVATIONS = ("relu6", "relu", "none")
POOLINGS = ("avg", "none")
HEAD_TYPES = ("classify", "yolo")
YOLO_FIELDS = ("ty", "tx", "th", "tw", "obj")  # per anchor, before the class logits (y, x, h, w: the op's order)
MAX_DETECTION_SCALES = 2


class SpecError(TfmcuError):
    """A spec field is missing or out of range. The message names the field (``stages[1].blocks[0].kernel``)."""


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of ``divisor`` (TensorFlow/Keras MobileNet rule, never below 90%)."""
    min_value = min_value or divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:
        new_value += divisor
    return int(new_value)


@dataclass
class BlockSpec:
    """One inverted residual block: [1x1 expand] -> kxk depthwise -> [SE] -> 1x1 linear project [+ residual]."""

    out_channels: int
    kernel: int = 3
    expand: float = 6.0
    stride: int = 1
    width: float = 1.0  # per-block width multiplier on out_channels (search space w)
    se: float = 0.0  # squeeze-excite ratio: SE hidden channels = in_channels * se (MnasNet/EfficientNet); 0 = off
    activation: str = "relu6"
    groups: int = 1  # groups of the two 1x1 convs (FBNet uses 2)
    residual: bool = True  # add the shortcut when shapes match


@dataclass
class StageSpec:
    blocks: list[BlockSpec]


@dataclass
class StemSpec:
    out_channels: int = 32
    kernel: int = 3
    stride: int = 2
    activation: str = "relu6"


@dataclass
class HeadSpec:
    """The head (module docstring): ``type`` "classify" or "yolo". Each type's own fields must keep the values of
    ``CLASSIFY_ONLY`` / ``YOLO_ONLY`` under the other type, and JSON holds only the fields of the head's type."""

    last_channels: int = 1280  # 0 = no last 1x1 conv (classify)
    pooling: str = "avg"  # classify
    num_classes: int = 1000  # classify: 0 = no classifier; yolo: K >= 1
    scale_last_channels: bool = False  # apply the global width multiplier to last_channels (MobileNetV2: only if >1)
    activation: str = "relu6"  # of the last 1x1 conv (classify) / of the head_channels convs (yolo)
    type: str = "classify"
    anchors: list[list[list[float]]] = field(default_factory=list)  # yolo: per scale, [w, h] pairs in (0, 1]
    head_channels: int = 0  # yolo: a 1x1 conv + activation before each prediction conv; 0 = none

    @classmethod
    def yolo(cls, num_classes: int, anchors: list[list[list[float]]], head_channels: int = 0,
             activation: str = "relu6") -> "HeadSpec":
        """A yolo head: ``anchors`` per scale (coarsest first), each a list of [w, h] relative to the input."""
        return cls(type="yolo", num_classes=num_classes, anchors=anchors, head_channels=head_channels,
                   activation=activation, **CLASSIFY_ONLY)

    def to_dict(self) -> dict[str, Any]:
        """The fields of the head's type: a classify head writes exactly what it wrote before yolo heads existed."""
        d = dataclasses.asdict(self)
        if self.type == "classify":
            for key in ("type", *YOLO_ONLY):
                d.pop(key)
        elif self.type == "yolo":
            d = {"type": d.pop("type"), **{k: v for k, v in d.items() if k not in CLASSIFY_ONLY}}
        return d


# The values a head's fields take under the other head type (and the JSON defaults of a yolo head).
CLASSIFY_ONLY: dict[str, Any] = {"last_channels": 0, "pooling": "none", "scale_last_channels": False}
YOLO_ONLY: dict[str, Any] = {"anchors": [], "head_channels": 0}


@dataclass
class NetSpec:
    name: str
    resolution: int = 224
    in_channels: int = 3
    width_multiplier: float = 1.0
    padding: str = "same"  # "same" (TF) or "symmetric" (k//2 each side + VALID, PyTorch / MCUNet exports)
    stem: StemSpec = field(default_factory=StemSpec)
    stages: list[StageSpec] = field(default_factory=list)
    head: HeadSpec = field(default_factory=HeadSpec)
    divisor: int = 8

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "head": self.head.to_dict()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> "NetSpec":
        spec = _parse_netspec(data)
        spec.validate()
        return spec

    @classmethod
    def from_json(cls, text: str) -> "NetSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str) -> "NetSpec":
        with open(path) as f:
            return cls.from_json(f.read())

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    # ---------------------------------------------------------------- validation
    def validate(self) -> "NetSpec":
        _check(isinstance(self.name, str) and self.name, "name", "a non-empty string")
        _check(_is_int(self.resolution) and 16 <= self.resolution <= 1024, "resolution", "an integer in 16..1024")
        _check(_is_int(self.in_channels) and self.in_channels >= 1, "in_channels", "a positive integer")
        _check(_is_num(self.width_multiplier) and 0 < self.width_multiplier <= 4, "width_multiplier", "in (0, 4]")
        _check(self.padding in PADDINGS, "padding", f"one of {PADDINGS}")
        _check(_is_int(self.divisor) and self.divisor >= 1, "divisor", "a positive integer")
        s = self.stem
        _check(_is_int(s.out_channels) and s.out_channels >= 1, "stem.out_channels", "a positive integer")
        _check(s.kernel in (1, 3, 5, 7), "stem.kernel", "one of 1, 3, 5, 7")
        _check(s.stride in (1, 2), "stem.stride", "1 or 2")
        _check(s.activation in ACTIVATIONS, "stem.activation", f"one of {ACTIVATIONS}")
        _check(len(self.stages) >= 1, "stages", "a non-empty list")
        for i, st in enumerate(self.stages):
            _check(len(st.blocks) >= 1, f"stages[{i}].blocks", "a non-empty list")
            for j, b in enumerate(st.blocks):
                p = f"stages[{i}].blocks[{j}]"
                _check(_is_int(b.out_channels) and b.out_channels >= 1, f"{p}.out_channels", "a positive integer")
                _check(b.kernel in (1, 3, 5, 7), f"{p}.kernel", "one of 1, 3, 5, 7")
                _check(_is_num(b.expand) and 1 <= b.expand <= 8, f"{p}.expand", "a number in [1, 8]")
                _check(b.stride in (1, 2), f"{p}.stride", "1 or 2")
                _check(_is_num(b.width) and 0 < b.width <= 2, f"{p}.width", "in (0, 2]")
                _check(_is_num(b.se) and 0 <= b.se < 1, f"{p}.se", "in [0, 1)")
                _check(b.activation in ACTIVATIONS, f"{p}.activation", f"one of {ACTIVATIONS}")
                _check(_is_int(b.groups) and b.groups >= 1, f"{p}.groups", "a positive integer")
                _check(isinstance(b.residual, bool), f"{p}.residual", "true or false")
        h = self.head
        _check(h.type in HEAD_TYPES, "head.type", f"one of {HEAD_TYPES}")
        _check(_is_int(h.last_channels) and h.last_channels >= 0, "head.last_channels", "an integer >= 0")
        _check(h.pooling in POOLINGS, "head.pooling", f"one of {POOLINGS}")
        _check(_is_int(h.num_classes) and h.num_classes >= 0, "head.num_classes", "an integer >= 0")
        _check(h.activation in ACTIVATIONS, "head.activation", f"one of {ACTIVATIONS}")
        if h.type == "yolo":
            _validate_yolo(h)
        else:
            _check(not (h.num_classes and h.pooling == "none"), "head.pooling", "'avg' when num_classes > 0")
            for key, value in YOLO_ONLY.items():
                _check(getattr(h, key) == value, f"head.{key}", f"{value!r} unless head.type is 'yolo'")
        # Shapes: the feature map must not vanish, and grouped convs must divide channels.
        sizes = self.feature_sizes()
        _check(sizes[0] >= 1, "resolution", f"large enough for the stem (got {self.resolution})")
        for blk, size in zip(self.resolve(), sizes[1:]):
            _check(size >= 1, "resolution", f"large enough for {blk.name} (feature map vanishes)")
            if blk.groups > 1:
                ok = blk.in_channels % blk.groups == 0 and blk.hidden % blk.groups == 0 and blk.out % blk.groups == 0
                _check(ok, f"{blk.path}.groups", f"a divisor of the block's channels ({blk.in_channels}, "
                                                  f"{blk.hidden}, {blk.out})")
        self.detection_scales()  # a second scale needs a block at half the final output stride
        return self

    # ---------------------------------------------------------------- resolved channels
    @property
    def stem_channels(self) -> int:
        return make_divisible(self.stem.out_channels * self.width_multiplier, self.divisor)

    @property
    def last_channels(self) -> int:
        h = self.head
        if not h.last_channels:
            return 0
        if h.scale_last_channels and self.width_multiplier > 1.0:
            return make_divisible(h.last_channels * self.width_multiplier, self.divisor)
        return h.last_channels

    def resolve(self) -> list["ResolvedBlock"]:
        """Per-block channel counts after width multipliers, in execution order (block index 1..N)."""
        out: list[ResolvedBlock] = []
        in_ch = self.stem_channels
        index = 1
        for i, st in enumerate(self.stages):
            for j, b in enumerate(st.blocks):
                oc = make_divisible(b.out_channels * self.width_multiplier * b.width, self.divisor)
                hidden = int(round(in_ch * b.expand))
                se_ch = max(1, int(in_ch * b.se)) if b.se > 0 else 0
                res = b.residual and b.stride == 1 and in_ch == oc
                out.append(ResolvedBlock(index=index, path=f"stages[{i}].blocks[{j}]", stage=i, in_channels=in_ch,
                                         hidden=hidden, out=oc, kernel=b.kernel, stride=b.stride,
                                         expand=b.expand, se_channels=se_ch, activation=b.activation,
                                         groups=b.groups, residual=res))
                in_ch = oc
                index += 1
        return out

    def feature_sizes(self) -> list[int]:
        """Output height (= width) of block 0 (the stem), 1, ..., N, in execution order (not validated)."""
        sizes = [_conv_out(self.resolution, self.stem.kernel, self.stem.stride, self.padding)]
        for blk in self.resolve():
            sizes.append(_conv_out(sizes[-1], blk.kernel, blk.stride, self.padding))
        return sizes

    def output_strides(self) -> list[int]:
        """Output stride (product of the strides so far) of block 0 (the stem), 1, ..., N."""
        strides = [self.stem.stride]
        for blk in self.resolve():
            strides.append(strides[-1] * blk.stride)
        return strides

    def detection_scales(self) -> list["DetectionScale"]:
        """The yolo head's outputs, coarsest first ([] for a classify head): scale 0 reads the last block, scale 1
        the last block whose output stride is half the final one. Raises SpecError when there is no such block."""
        h = self.head
        if h.type != "yolo":
            return []
        strides, sizes = self.output_strides(), self.feature_sizes()
        taps = [len(strides) - 1]
        if len(h.anchors) > 1:
            finer = [b for b, s in enumerate(strides) if 2 * s == strides[-1]]
            _check(bool(finer), "head.anchors", f"1 scale for this backbone (a second scale reads the last block at "
                                                f"output stride {strides[-1] / 2:g}; no block has it)")
            taps.append(finer[-1])
        return [DetectionScale(index=i, block=b, stride=strides[b], grid=sizes[b],
                               anchors=tuple((float(w), float(ht)) for w, ht in h.anchors[i]),
                               num_classes=h.num_classes) for i, b in enumerate(taps)]

    @property
    def num_blocks(self) -> int:
        """Stem + inverted residual blocks (the head is not counted)."""
        return 1 + sum(len(st.blocks) for st in self.stages)

    def replace(self, **changes: Any) -> "NetSpec":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ResolvedBlock:
    index: int
    path: str
    stage: int
    in_channels: int
    hidden: int
    out: int
    kernel: int
    stride: int
    expand: float
    se_channels: int
    activation: str
    groups: int
    residual: bool

    @property
    def has_expand(self) -> bool:
        return self.expand != 1

    @property
    def name(self) -> str:
        return f"block{self.index}"


@dataclass(frozen=True)
class DetectionScale:
    """One yolo output: reads the output of block ``block`` (0 = the stem), a ``grid`` x ``grid`` map at output
    ``stride``; predicts ``channels`` = A * (5 + K) raw logits per cell (layout: module docstring)."""

    index: int
    block: int
    stride: int
    grid: int
    anchors: tuple[tuple[float, float], ...]  # [w, h] relative to the input
    num_classes: int

    @property
    def channels(self) -> int:
        return len(self.anchors) * (len(YOLO_FIELDS) + self.num_classes)

    @property
    def name(self) -> str:
        """Op name prefix: ``head_scale{i}_conv`` (optional 1x1 conv), ``head_scale{i}_pred`` (the output)."""
        return f"head_scale{self.index}"


def _validate_yolo(h: HeadSpec) -> None:
    _check(_is_int(h.num_classes) and h.num_classes >= 1, "head.num_classes", "an integer >= 1 for a yolo head")
    for key, value in CLASSIFY_ONLY.items():
        _check(getattr(h, key) == value, f"head.{key}", f"{value!r} for a yolo head")
    _check(_is_int(h.head_channels) and h.head_channels >= 0, "head.head_channels", "an integer >= 0")
    _check(isinstance(h.anchors, (list, tuple)) and 1 <= len(h.anchors) <= MAX_DETECTION_SCALES, "head.anchors",
           f"a list of 1..{MAX_DETECTION_SCALES} scales, each a list of [w, h] anchors")
    for i, scale in enumerate(h.anchors):
        _check(isinstance(scale, (list, tuple)) and len(scale) >= 1, f"head.anchors[{i}]",
               "a non-empty list of [w, h] anchors")
        for j, a in enumerate(scale):
            ok = isinstance(a, (list, tuple)) and len(a) == 2 and all(_is_num(v) and 0 < v <= 1 for v in a)
            _check(ok, f"head.anchors[{i}][{j}]", "a [w, h] pair of numbers in (0, 1] (fractions of the input size)")


def _conv_out(size: int, k: int, s: int, padding: str) -> int:
    if padding == "same":
        return -(-size // s)
    return (size + 2 * (k // 2) - k) // s + 1


# -------------------------------------------------------------------- parsing helpers
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check(cond: bool, field_name: str, expected: str) -> None:
    if not cond:
        raise SpecError(f"spec field '{field_name}' must be {expected}")


def _build(cls: type, data: Any, path: str, nested: dict[str, Any] | None = None) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"spec field '{path or 'spec'}' must be an object")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = f"'{path}'" if path else "the spec"
        raise SpecError(f"unknown field '{unknown[0]}' in {where}; known fields: {', '.join(names)}")
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if nested and key in nested:
            value = nested[key](value, sub)
        kwargs[key] = value
    required = [n for n, f in names.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]  # type: ignore
    for n in required:
        if n not in kwargs:
            raise SpecError(f"spec field '{(path + '.') if path else ''}{n}' is required")
    return cls(**kwargs)


def _parse_block(data: Any, path: str) -> BlockSpec:
    return _build(BlockSpec, data, path)


def _parse_stage(data: Any, path: str) -> StageSpec:
    def blocks(v: Any, p: str) -> list[BlockSpec]:
        if not isinstance(v, list):
            raise SpecError(f"spec field '{p}' must be a list")
        return [_parse_block(b, f"{p}[{k}]") for k, b in enumerate(v)]
    return _build(StageSpec, data, path, {"blocks": blocks})


def _parse_head(data: Any, path: str) -> HeadSpec:
    """A yolo head's JSON leaves the classification fields out: they default to ``CLASSIFY_ONLY``."""
    if isinstance(data, dict) and data.get("type") == "yolo":
        data = {**CLASSIFY_ONLY, **data}
    return _build(HeadSpec, data, path)


def _parse_netspec(data: Any) -> NetSpec:
    def stages(v: Any, p: str) -> list[StageSpec]:
        if not isinstance(v, list):
            raise SpecError(f"spec field '{p}' must be a list")
        return [_parse_stage(s, f"{p}[{k}]") for k, s in enumerate(v)]
    return _build(NetSpec, data, "", {
        "stem": lambda v, p: _build(StemSpec, v, p),
        "head": _parse_head,
        "stages": stages,
    })


# -------------------------------------------------------------------- search space (paper, section 3.3)
@dataclass(frozen=True)
class SearchSpace:
    """The MCUNetV2 search space as data: per-block kernel / expansion / width, per-stage depth, resolution.

    A network is encoded as a flat genome (see ``encode``): resolution, then per stage its depth, then for each of
    the stage's ``max(depths)`` block slots (kernel, expand, width). Slots past the stage depth are kept so mutation
    and crossover work position-wise; they are ignored when decoding.
    """

    kernels: tuple[int, ...] = (3, 5, 7)
    expands: tuple[float, ...] = (3, 4, 6)
    depths: tuple[int, ...] = (2, 3, 4)
    widths: tuple[float, ...] = (0.5, 0.75, 1.0)
    resolutions: tuple[int, ...] = (96, 128, 160, 192, 224, 256)

    def encode(self, spec: NetSpec, base: NetSpec) -> list[Any]:
        """Genome of ``spec`` relative to ``base`` (which gives stage strides and channels)."""
        genome: list[Any] = [spec.resolution]
        for st in spec.stages:
            genome.append(len(st.blocks))
            for k in range(max(self.depths)):
                b = st.blocks[min(k, len(st.blocks) - 1)]
                genome += [b.kernel, b.expand, b.width]
        return genome

    def decode(self, genome: list[Any], base: NetSpec) -> NetSpec:
        """Build a spec from a genome; the base spec gives stem, head, stage channels and strides."""
        it = iter(genome)
        res = next(it)
        stages = []
        for st in base.stages:
            depth = next(it)
            blocks = []
            for k in range(max(self.depths)):
                kernel, expand, width = next(it), next(it), next(it)
                if k < depth:
                    proto = st.blocks[0]
                    blocks.append(dataclasses.replace(proto, kernel=kernel, expand=expand, width=width,
                                                      stride=proto.stride if k == 0 else 1))
            stages.append(StageSpec(blocks))
        return dataclasses.replace(base, resolution=res, stages=stages).validate()

    def sample(self, base: NetSpec, rng: random.Random) -> NetSpec:
        genome: list[Any] = [rng.choice(self.resolutions)]
        for _ in base.stages:
            genome.append(rng.choice(self.depths))
            for _ in range(max(self.depths)):
                genome += [rng.choice(self.kernels), rng.choice(self.expands), rng.choice(self.widths)]
        return self.decode(genome, base)

    def choices(self, position: int, num_stages: int) -> tuple[Any, ...]:
        """The allowed values at a genome position (for mutation)."""
        if position == 0:
            return self.resolutions
        slot = (position - 1) % (1 + 3 * max(self.depths))
        if slot == 0:
            return self.depths
        return (self.kernels, self.expands, self.widths)[(slot - 1) % 3]
