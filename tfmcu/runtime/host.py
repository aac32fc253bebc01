"""Whole models on the host: TF Lite and TFLM outputs and TFLM's arena for one model, builtin-only or custom mode.

* ``evaluate(model, samples, resolver)``: TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's
  arena. A custom-mode model (``TFMCU_PATCH_STAGE`` ops, ``tfmcu.stage.custom``: the patch stage, and with
  ``rewrite --rest_convs=tfmcu`` one more per convolution of the rest) runs WHOLE in TFLM built from source with our
  kernel (``tfmcu.runtime.tflm_host``): outputs and the measured arena (the kernel's persistent bytes in
  ``ArenaStats.custom``). TF Lite has no kernel for the op: ``HostRunner`` runs every such op in the C kernels
  (ctypes) and the builtin ops in TF Lite (with the same ``resolver``). A model whose stage streams its input
  (``rewrite --stream_input``) takes the images as samples; both sides feed its rows through a provider that checks
  the contract, and ``ModelRun.streamed_rows_read`` has the rows read. ``tflm=False``: TF Lite's outputs only.
* ``evaluate(..., isolate=True)`` runs all of it in a child process (``tfmcu.runtime.isolate``).
* ``host_model(model)``: the model's signature (a streamed-input model's is its image) and, for a custom-mode model,
  its ``HostRunner`` (a malformed description is a one-line ``TFLMError`` here, before anything runs).

``model``: a ``tfmcu.tflite.model.TfliteModel`` (parsed once, shared by the steps) or the bytes of one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfmcu.kernels import PatchKernelError
from tfmcu.kernels.binding import prepare, run_stage, run_stage_streamed
from tfmcu.runtime.isolate import isolatable, phase
from tfmcu.runtime.model_io import ModelInfo, TFLMError, parsed, prepared
from tfmcu.runtime.tflite import run_tflite, tflite_outputs
from tfmcu.runtime.tflm import ArenaStats, measure_arena, run_tflm, tflm_outputs
from tfmcu.runtime.tflm_host import MEASURED_BY, image_samples, input_signature, run_whole, streamed_image
from tfmcu.stage.common import SCHEDULE_METADATA, RewriteError
from tfmcu.stage.custom import PATCH_STAGE_OP, load_custom
from tfmcu.tflite import schema as ts
from tfmcu.tflite.editor import ModelEditor
from tfmcu.tflite.model import TfliteModel, as_model


class HostRunner:
    """Runs a custom-mode model on the host: every TFMCU_PATCH_STAGE op in the C kernels (ctypes), the builtin ops
    in TFLM or TF Lite. One stage at operator 0 (``rewrite --mode=custom``): the stage, then ``rest`` (the model
    without it, with the memory plan a deployment uses) in one interpreter. Several stages, or stages further on
    (``rewrite --rest_convs=tfmcu``): the model is cut into runs of builtin ops (each a model of its own, run for
    all samples in one interpreter) and the stages between them, in the model's operator order. A stage that streams
    its input (``rewrite --stream_input``) reads the image through a provider (``run_stage_streamed``), whose calls
    are checked against the contract (rows in increasing order, each at most once): the samples are the images."""

    def __init__(self, data: TfliteModel | bytes, where: str = "model"):
        self.where = where
        self.model = as_model(data, where)
        self.custom = load_custom(self.model, where, all_stages=True)
        try:  # the description comes from a file: every array must fit its params, the C side checks the rest
            for p in self.custom.stages.values():
                for spec, ins, out in zip(p.layers, p.layer_inputs, p.layer_outputs):
                    spec.check_arrays(p.tensor_shapes[ins[0]][2], p.tensor_shapes[out][2])
                prepare(p)
        except (PatchKernelError, IndexError, KeyError, TypeError) as e:
            raise RewriteError(f"{where}: invalid {PATCH_STAGE_OP} description ({e})") from None
        self.streamed = streamed_image(self.model) is not None
        self._segments: list[tuple[str, Any, list[int], list[int], str]] | None = None

    def stage(self, x: np.ndarray, op: int | None = None) -> np.ndarray:
        """The output of stage ``op`` (operator index; default: the first) for input ``x``."""
        return self._stage(x, self._first if op is None else op)[0]

    @property
    def _first(self) -> int:
        return min(self.custom.stages)

    def _stage(self, x: np.ndarray, op: int) -> tuple[np.ndarray, int | None]:
        """(stage ``op``'s output, the image rows it read through the provider, or None when not streamed)."""
        p = self.custom.stages[op]
        a = np.asarray(x)
        if a.size == int(np.prod(p.input_shape)) and a.shape != p.input_shape:
            a = a.reshape(p.input_shape)  # a fully connected layer's [1, C] as the 1x1 stage's [1, 1, 1, C]
        try:
            if not (self.streamed and op == 0):
                return run_stage(p, a), None
            out, calls = run_stage_streamed(p, a)
        except PatchKernelError as e:
            raise TFLMError(f"{self.where}: {PATCH_STAGE_OP} operator {op}: {e}") from None
        nxt = 0
        for start, count in calls:  # the TfmcuInputProvider contract
            if start < nxt or count <= 0 or start + count > p.input_shape[1]:
                raise TFLMError(f"{self.where}: the stage broke the input provider's contract (rows {start}.."
                                f"{start + count - 1} after row {nxt - 1})")
            nxt = start + count
        return out, sum(c for _, c in calls)

    def run(self, samples: Sequence[Any], rest: str = "tflm", resolver: str = "reference") -> list[list[np.ndarray]]:
        """Outputs per sample; ``rest``: "tflm" or "tflite" (with TF Lite's ``resolver`` kernels)."""
        return self.run_rows(samples, rest, resolver)[0]

    def run_rows(self, samples: Sequence[Any], rest: str = "tflm",
                 resolver: str = "reference") -> tuple[list[list[np.ndarray]], list[int] | None]:
        """``run`` and, for a streamed-input model, the image rows each sample's stage read (else None)."""
        def builtins(model: bytes, rows: list[tuple[np.ndarray, ...]], what: str) -> list[list[np.ndarray]]:
            if rest == "tflm":
                return run_tflm(model, rows, where=f"{self.where} ({what})")
            return run_tflite(model, rows, resolver, where=f"{self.where} ({what})")

        xs = [s[0] if isinstance(s, (tuple, list)) else s for s in samples]
        if self.custom.rest is not None:  # one stage, first: the stage, then the rest in one interpreter
            staged = [self._stage(x, 0) for x in xs]
            rows = [r for _, r in staged] if self.streamed else None
            return builtins(self.custom.rest, [(y,) for y, _ in staged], "rest"), rows
        m = self.model.flatbuffer
        sg = m.subgraphs[0]
        info = self.model.info
        env: list[dict[int, np.ndarray]] = []  # per sample: tensor index -> value
        for s in samples:
            arrays = (s,) if isinstance(s, np.ndarray) else tuple(s)
            env.append({t.index: a for t, a in zip(info.inputs, arrays)})
        rows: list[int] | None = None
        for kind, what, ins, outs, label in self._plan():
            if kind == "stage":
                op = int(what)
                src = int(sg.operators[op].inputs[0])
                results = [self._stage(xs[i] if self.streamed and op == 0 else e[src], op) for i, e in enumerate(env)]
                if self.streamed and op == 0:
                    rows = [int(r or 0) for _, r in results]
                shape = tuple(int(d) for d in sg.tensors[outs[0]].shape)
                for e, (y, _) in zip(env, results):
                    e[outs[0]] = y.reshape(shape)
            else:
                got = builtins(what, [tuple(e[t] for t in ins) for e in env], label)
                for e, values in zip(env, got):
                    e.update(zip(outs, values))
        return [[e[t.index] for t in info.outputs] for e in env], rows

    def _plan(self) -> list[tuple[str, Any, list[int], list[int], str]]:
        """The model as ("stage", operator index, [input], [output], label) and ("ops", a model of a run of builtin
        ops, its input tensors, its output tensors, label) in operator order (tensor indices of the whole model)."""
        if self._segments is not None:
            return self._segments
        m = self.model.flatbuffer
        sg = m.subgraphs[0]
        ops = list(sg.operators)
        model_outputs = {int(t) for t in sg.outputs}
        const = {k for k, t in enumerate(sg.tensors) if ts.buffer_array(m, t) is not None}

        def reads(k: int) -> set[int]:
            return {int(t) for t in ops[k].inputs if t >= 0} - const

        runs: list[list[int]] = []
        for k in range(len(ops)):
            if k in self.custom.stages:
                runs.append([k])
            elif runs and runs[-1][0] not in self.custom.stages:
                runs[-1].append(k)
            else:
                runs.append([k])
        plan: list[tuple[str, Any, list[int], list[int], str]] = []
        for n, run in enumerate(runs):
            later = set(model_outputs)
            for r in runs[n + 1:]:
                for k in r:
                    later |= reads(k)
            produced = [int(t) for k in run for t in ops[k].outputs if t >= 0]
            outs = [t for t in produced if t in later]
            if run[0] in self.custom.stages:
                plan.append(("stage", run[0], [int(ops[run[0]].inputs[0])], outs[:1] or produced[:1],
                             f"operator {run[0]}"))
                continue
            ins = sorted({t for k in run for t in reads(k)} - set(produced))
            plan.append(("ops", segment_model(m, run, ins, outs), ins, outs, f"operators {run[0]}..{run[-1]}"))
        self._segments = plan
        return plan


def segment_model(model: ts.ModelT, ops: Sequence[int], inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
    """A model of operators ``ops`` of ``model`` (a run of builtin ops) with ``inputs`` and ``outputs`` (tensor
    indices of ``model``, in that order) as its own; no signature, no metadata of ours, no memory plan."""
    ed = ModelEditor(copy.deepcopy(model))
    sg = ed.subgraph
    sg.operators = [sg.operators[k] for k in ops]
    sg.inputs = np.asarray(list(inputs), dtype=np.int32)
    sg.outputs = np.asarray(list(outputs), dtype=np.int32)
    ed.model.signatureDefs = []
    ed.remove_metadata(SCHEDULE_METADATA)
    ed.drop_unused_tensors()
    return ed.to_bytes()


@dataclass
class ModelRun:
    tflite: list[list[np.ndarray]] | None  # outputs per sample (None when not asked)
    tflm: list[list[np.ndarray]] | None  # (None: evaluate(tflm=False))
    arena: ArenaStats | None
    custom_mode: bool = False
    # a streamed-input model: the image rows each sample's stage read through the provider, per side ("tflite": the
    # C executor through ctypes, "tflm": the kernel in TFLM built from source), each checked against the contract
    streamed_rows_read: dict[str, list[int]] | None = None


def host_model(model: TfliteModel, where: str = "model") -> tuple[ModelInfo, HostRunner | None]:
    """The model's signature (``tfmcu.runtime.tflm_host.input_signature``: a streamed-input model takes the image)
    and its ``HostRunner`` when it is a custom-mode model (``TFMCU_PATCH_STAGE`` ops; None otherwise): a malformed
    stage is a one-line ``TFLMError``. ``model``: parsed (``tfmcu.runtime.model_io.read_model`` or ``parsed``)."""
    try:
        runner = HostRunner(model, where) if PATCH_STAGE_OP in model.info.custom_ops else None
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    return input_signature(model, where), runner


@isolatable
def evaluate(model: TfliteModel | bytes, samples: Sequence[Any], resolver: str | None = "reference",
             where: str = "model", tflm: bool = True) -> ModelRun:
    """TF Lite outputs (``resolver=None``: skipped), TFLM outputs and TFLM's arena for one model (see the module
    docstring); ``tflm=False``: TF Lite's outputs only, for callers that check them against another TFLM (firmware
    on the target). ``isolate=True``: all of it in a child process. A streamed-input model's samples are its images
    (``tfmcu.runtime.tflm_host.input_signature``)."""
    model = parsed(model, where)
    streamed = streamed_image(model) is not None
    # parsed and checked once for every interpreter below
    rows = image_samples(model, samples, where) if streamed else prepared(model, samples, where)[2]
    custom = f"custom:{PATCH_STAGE_OP}" in model.op_names
    read: dict[str, list[int]] = {}
    try:
        tfl = None
        if resolver:
            phase("TF Lite")
            if custom:
                tfl, host_rows = HostRunner(model, where).run_rows(rows, rest="tflite", resolver=resolver)
                if host_rows is not None:
                    read["tflite"] = host_rows
            else:
                tfl = tflite_outputs(model, rows, resolver, where)
        if not tflm:
            return ModelRun(tfl, None, None, custom, read or None)
        phase("TFLM")
        if not custom:
            return ModelRun(tfl, tflm_outputs(model, rows, None, where), measure_arena(model, where=where))
        # the whole model in TFLM built from source with our TFMCU_PATCH_STAGE kernel (measured arena)
        whole = run_whole(model, rows, where)
    except RewriteError as e:
        raise TFLMError(str(e)) from None
    if streamed:
        read["tflm"] = whole.streamed_rows_read
    a = whole.arena
    stats = {"measured_by": MEASURED_BY, "pointer_bytes": a.pointer_bytes,
             "patch_stage_persistent_bytes": a.patch_stage_persistent_bytes, "allocations": a.allocations}
    return ModelRun(tfl, whole.outputs, ArenaStats(a.arena_used_bytes, a.head_bytes, a.tail_bytes, custom=stats),
                    custom_mode=True, streamed_rows_read=read or None)
