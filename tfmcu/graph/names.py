"""Names: which block an op belongs to, and readable op names, shared by the Keras and .tflite lowerings.

* ``block_of_name(name)``: the block a layer / op / tensor name belongs to, for tfmcu builder names and the
  Keras applications' MobileNetV2/V3 names (the stem is block 0; the head comes after the last numbered block).
* ``name_components`` / ``layer_of``: the TF op names a TFLite tensor name joins with ';', and the layer part of one.
* ``name_ops(ops)``: readable, unique op names from their tensor names (``block_1_expand``, not ``op 17``).
* ``assign_blocks(ops, ...)``: blocks of the ops of a lowered .tflite: from names when they parse, else by structure.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tfmcu.graph import ir

# TF op names that mark the component of a fused tensor name holding the conv / matmul itself.
_MAIN_TF_OPS = ("conv2d", "depthwise", "biasadd", "matmul", "convolution", "conv")
GENERIC_NAMES = re.compile(r"^(StatefulPartitionedCall|PartitionedCall|Identity)(_\d+)?(:\d+)?\d*$")

# ============================================================================= blocks from names
HEAD = "head"

_NAME_RULES: list[tuple[re.Pattern[str], Any]] = [
    # tfmcu builder / ir.from_spec names
    (re.compile(r"^stem(?:_|$)"), lambda m: (0, "stem")),
    (re.compile(r"^block(\d+)(?:_|$)"), lambda m: (int(m.group(1)), f"block{int(m.group(1))}")),
    (re.compile(r"^(?:head|classifier)(?:_|$)"), lambda m: (None, HEAD)),
    # tf_keras.applications MobileNetV2 (and V3, whose layer names use '/')
    (re.compile(r"^(?:Conv1(?:_|$)|bn_Conv1$|Conv$)"), lambda m: (0, "stem")),
    (re.compile(r"^expanded_conv(?:_(\d+))?(?=_|$)"),
     lambda m: (int(m.group(1) or 0) + 1, "expanded_conv" + (f"_{m.group(1)}" if m.group(1) else ""))),
    (re.compile(r"^block_(\d+)(?=_|$)"), lambda m: (int(m.group(1)) + 1, f"block_{int(m.group(1))}")),
    (re.compile(r"^(?:Conv_\d+(?:_|$)|out_relu$|global_average_pooling2d(?:_\d+)?$|predictions(?:_|$)|"
                r"Predictions$|Logits$)"), lambda m: (None, HEAD)),
    # tf_keras.applications EfficientNet: block{stage}{letter}_*, top_* (the stem is stem_*)
    (re.compile(r"^block(\d+)([a-z])(?=_|$)"),
     lambda m: (int(m.group(1)) * 26 + ord(m.group(2)) - ord("a") + 1, f"block{m.group(1)}{m.group(2)}")),
    (re.compile(r"^(?:top_|avg_pool$)"), lambda m: (None, HEAD)),
]


def _parse_component(comp: str) -> tuple[int | None, str] | None:
    for pattern, result in _NAME_RULES:
        m = pattern.match(comp)
        if m:
            return result(m)
    return None


def block_of_name(name: str, prefix: str = "") -> tuple[int | None, str]:
    """Block of a layer / op / tensor name: ``(index, label)``.

    * ``(i, label)`` for the stem (``i = 0``) and numbered blocks: tfmcu names ``stem*`` -> 0, ``block{i}_*`` -> i;
      Keras MobileNetV2 names ``Conv1*`` / ``bn_Conv1`` -> 0, ``expanded_conv_*`` -> 1, ``block_{i}_*`` -> i + 1
      (MobileNetV3: ``Conv`` -> 0, ``expanded_conv_{i}/...`` -> i + 1); EfficientNet's ``block{s}{x}_*`` in the
      order of stage and letter.
    * ``(None, "head")`` for the head: ``head*``, ``classifier``, ``Conv_1*``, ``out_relu``,
      ``global_average_pooling2d*``, ``predictions``, ``Logits``. Its index is one past the last numbered block.
    * ``(None, "")`` when the name says nothing.

    TFLite-style names are accepted: ``;``-separated alternatives are tried in turn and ``/``-scoped paths are
    searched left to right, so ``"mbv2/block3_expand_relu/Relu6"`` -> block 3 and
    ``"expanded_conv_3/squeeze_excite/Conv_1"`` -> block 4. A scope ``prefix`` (e.g. the model name, in case it
    happens to parse) is removed first.
    """
    for part in str(name).split(";"):
        if prefix and part.startswith(prefix + "/"):
            part = part[len(prefix) + 1:]
        for comp in part.split("/"):
            found = _parse_component(comp.split(":")[0]) if comp else None
            if found is not None:
                return found
    return None, ""


# ============================================================================= names
def name_components(tensor_name: str) -> list[str]:
    """The TF op names a TFLite tensor name joins with ';' (fused ops), empty ones dropped."""
    return [c.strip() for c in tensor_name.split(";") if c.strip()]


def layer_of(component: str) -> str:
    """Layer part of one TF op name: ``model/block_1_expand/Conv2D1`` -> ``block_1_expand`` (model scope and the
    TF op dropped; nested scopes kept: ``model/sub/layer/Op`` -> ``sub/layer``); names without '/' lose a ``:0``."""
    parts = [p for p in component.split("/") if p]
    if not parts:
        return component
    if len(parts) >= 3:
        return "/".join(parts[1:-1])
    if len(parts) == 2:
        return parts[0]
    return re.sub(r":\d+$", "", parts[0])


def _readable_name(op: ir.Op, index: int) -> str:
    comps = name_components(op.attrs.get("name_source", op.attrs.get("tensor_name", "")))
    if not comps:
        return f"{op.type}_{index}"
    chosen = comps[0]
    if op.type in (ir.CONV, ir.DEPTHWISE, ir.FULLY_CONNECTED):
        for c in comps:
            last = c.rstrip("/").rsplit("/", 1)[-1].lower()
            if "/" in c and last.startswith(_MAIN_TF_OPS):
                chosen = c
                break
    name = layer_of(chosen)
    if GENERIC_NAMES.match(name) or not name:
        return f"{op.type.replace(':', '_')}_{index}"
    return name


def name_ops(ops: list[ir.Op]) -> None:
    seen: dict[str, int] = {}
    for i, op in enumerate(ops):
        name = _readable_name(op, i)
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
            while name in seen:
                name += "_"
        seen.setdefault(name, 0)
        op.name = name


# ============================================================================= blocks
def assign_blocks(ops: list[ir.Op], tensors: dict[str, ir.Tensor], inputs: list[str], outputs: list[str],
                  parser: Callable[[str], tuple[int | None, str]] | None = None) -> dict[int, str]:
    """Set ``op.block`` / ``op.block_name`` on every op (non-decreasing along ``ops``); returns block names.

    1. From names: ``parser`` (default ``block_of_name``) applied to the layer names inside each
       op's tensor name; used when it places most conv ops and never goes backwards.
    2. Structural: a new block begins after the first conv (the stem), after every later ADD and after every CONV
       without activation (linear bottleneck), each only where exactly one tensor is alive (the ops before the first
       conv, an input's preprocessing, end none); not when a block would hold more than MAX_BLOCK_CONVS convs.
    3. One block per op.
    """
    result = _blocks_from_names(ops, parser or block_of_name)
    if result is None:
        result = _blocks_structural(ops, inputs, outputs)
    if result is None:
        result = [(i, f"op{i}") for i in range(len(ops))]
    # Dense numbering 0..K-1 in order of appearance.
    dense: dict[int, int] = {}
    names: dict[int, str] = {}
    for op, (b, label) in zip(ops, result):
        if b not in dense:
            dense[b] = len(dense)
            names[dense[b]] = label
        op.block = dense[b]
        op.block_name = names[dense[b]]
    return names


def _op_labels(op: ir.Op, parser: Callable[[str], tuple[int | None, str]]) -> tuple[int | None, str | None]:
    """The first block index any layer name of the op parses to (else a bare label such as "head")."""
    label_only = None
    for comp in name_components(op.attrs.get("name_source", op.attrs.get("tensor_name", ""))):
        parts = [p for p in re.sub(r":\d+$", "", comp).split("/") if p]
        cands = [layer_of(comp)] + parts[1:-1][::-1] if len(parts) > 1 else parts
        for cand in cands:
            try:
                index, label = parser(cand)
            except Exception:  # a parser that rejects a name is a non-match
                continue
            if index is not None:
                return int(index), label
            if label and label_only is None and label.startswith("head"):
                label_only = label
    return None, label_only


_CONVS = (ir.CONV, ir.DEPTHWISE)
# The most convolutions a structural block may hold (a squeeze-excite block has five); more: one block per op
MAX_BLOCK_CONVS = 8


def _blocks_from_names(ops: list[ir.Op], parser) -> list[tuple[int, str]] | None:
    parsed = [_op_labels(op, parser) for op in ops]
    convs = [i for i, op in enumerate(ops) if op.type in _CONVS + (ir.FULLY_CONNECTED,)]
    placed = [i for i in convs if parsed[i][0] is not None or parsed[i][1] is not None]
    if not any(p[0] is not None for p in parsed) or 2 * len(placed) < len(convs):
        return None
    out: list[tuple[int, str]] = []
    cur, cur_label, head = None, "", None
    max_index = max(p[0] for p in parsed if p[0] is not None)
    for (index, label) in parsed:
        if index is not None:
            if head is not None or (cur is not None and index < cur):
                return None  # names go backwards: do not trust them
            if index != cur:
                cur, cur_label = index, label or f"block{index}"
        elif label is not None and head is None:
            head = (max_index + 1, label)
        if head is not None:
            out.append(head)
        elif cur is None:
            out.append((-1, "input"))  # ops before the first named one (e.g. QUANTIZE) join its block below
        else:
            out.append((cur, cur_label))
    # Leading unnamed ops join the first named block.
    first = next((b for b in out if b[0] != -1), None)
    if first is None:
        return None
    return [first if b[0] == -1 else b for b in out]


def _blocks_structural(ops: list[ir.Op], inputs: list[str], outputs: list[str]) -> list[tuple[int, str]] | None:
    last_use: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            last_use[t] = i
    end = len(ops)
    for t in outputs:
        last_use[t] = end
    born: dict[str, int] = {t: -1 for t in inputs}
    for i, op in enumerate(ops):
        for t in op.outputs:
            born.setdefault(t, i)

    def alive_after(i: int) -> int:
        return sum(1 for t, b in born.items() if b <= i and last_use.get(t, b) > i)

    boundaries = []
    first_conv = next((i for i, op in enumerate(ops) if op.type in _CONVS), None)
    for i, op in enumerate(ops[:-1]):
        if first_conv is not None and i < first_conv:
            continue  # the input's preprocessing (a Rescaling's MUL and ADD) ends no block
        linear = op.type == ir.CONV and op.activation == "none"
        if (op.type == ir.ADD or linear) and alive_after(i) == 1:
            boundaries.append(i)
    if not boundaries:
        return None
    if first_conv is not None and first_conv < boundaries[0] and alive_after(first_conv) == 1:
        boundaries.insert(0, first_conv)
    out, b = [], 0
    for i in range(len(ops)):
        out.append((b, "stem" if b == 0 and first_conv is not None and boundaries[0] == first_conv
                    else ("head" if b == len(boundaries) else f"block{b}")))
        if b < len(boundaries) and i == boundaries[b]:
            b += 1
    # a "block" of many convolutions is a plain chain the rules did not cut (a MobileNet (V1) whose only linear
    # conv is its classifier): not blocks
    convs = [sum(1 for (blk, _), op in zip(out, ops) if blk == k and op.type in _CONVS) for k in range(b + 1)]
    if max(convs) > MAX_BLOCK_CONVS:
        return None
    return out
