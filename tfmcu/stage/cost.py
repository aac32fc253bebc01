"""The search's cost model of custom mode: ``CustomArenaCost``, the predicted TFLM arena (and instructions) of the
custom-mode model a schedule gives, as a cost function of ``tfmcu.plan.search``, for the model ``CustomOptions``
(in-place rest, halo caches, streamed input, the rest's convolutions) asks for. Each plan is priced from the model
``tfmcu.stage.custom`` writes for it, as the writer decides it, before any byte is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


from tfmcu.graph import ir
from tfmcu.plan.arena import (DEFAULT_KERNELS, KERNEL_SETS, MVE_CORES, builtin_of, const_inputs, get_build,
                              op_allocations, operator_tail, persistent_bytes, predict_arena, predict_model_arena,
                              stage_op_alloc)
from tfmcu.plan.halo import HaloCaches, HaloOptions, halo_caches, select
from tfmcu.plan.regions import PatchSchedule, ScheduleError
from tfmcu.plan.search import Evaluation, Plan, Segment
from tfmcu.stage.common import RewriteResult
from tfmcu.stage.custom import FLASH_OPS, convs_to_flash, pool_after, rewrite_stages
from tfmcu.tflite.model import TfliteModel, as_model


def _details(p: Any) -> dict[str, Any]:
    return {"predicted_arena_bytes": p.total, "predicted_arena_head_bytes": p.head,
            "predicted_arena_tail_bytes": p.tail, "persistent_apart": bool(p.details.get("persistent_apart"))}


REST_CONVS = ("tflm", "tfmcu")


@dataclass(frozen=True, kw_only=True)
class CustomOptions:
    """What custom mode builds besides the schedule (``rewrite --mode=custom``'s flags; their defaults here).

    ``inplace``: the rest of the graph planned in place, with the overlaps ``kernels`` allow (TFLM's reference
    kernels, or the CMSIS-NN build: ``tfmcu.plan.memory_plan``); ``halo``: the halo caches
    (``tfmcu.plan.halo.HaloOptions``); ``stream_input``: the stage reads the image through the application's input
    provider; ``rest_convs``: ``tfmcu`` runs the rest's convolutions by our kernels (``convs_to_flash``)."""

    inplace: bool = False
    halo: HaloOptions = field(default_factory=HaloOptions)
    stream_input: bool = False
    rest_convs: str = "tflm"
    kernels: str = DEFAULT_KERNELS  # the kernels an in-place plan is derived for (tfmcu.plan.arena.KERNEL_SETS)
    core: str | None = None  # the core whose read orders it holds for (CMSIS-NN's Helium code on MVE_CORES; None: DSP)

    def validate(self) -> "CustomOptions":
        """``ScheduleError`` (one line, naming the flag) for a value no custom-mode rewrite takes."""
        self.halo.validate()
        if self.rest_convs not in REST_CONVS:
            raise ScheduleError(f"--rest_convs={self.rest_convs}: expected one of {', '.join(REST_CONVS)}")
        if self.kernels not in KERNEL_SETS:
            raise ScheduleError(f"--kernels={self.kernels}: expected one of {', '.join(KERNEL_SETS)}")
        return self

    @property
    def label(self) -> str:
        """How a search report names this configuration (a variant of ``CustomArenaCost``)."""
        return ", ".join(self._parts(halo=True))

    def phrase(self, plan: Plan) -> str:
        """How this configuration reads after ``plan``'s description: its halo mode only where the plan leaves a
        stage's caches to it."""
        first = next((st for st in plan.stages if st.start == 0), None)
        held = first is not None and first.passes > 1  # a first stage in passes reads its input in every pass
        parts = self._parts(halo=bool(plan.open_stages), streamed=not held)
        return f" ({', '.join(parts)})" if parts else ""

    def _parts(self, halo: bool, streamed: bool = True) -> list[str]:
        parts = [f"halo {self.halo.mode}"] if halo else []
        if self.inplace:
            helium = self.kernels == "cmsis_nn" and self.core in MVE_CORES
            parts.append(f"rest in place ({self.kernels}{', Helium' if helium else ''})")
        if self.stream_input:
            parts.append("input streamed" if streamed else "input held whole: the first stage runs in passes")
        if self.rest_convs == "tfmcu":
            parts.append("rest convs by tfmcu")
        return parts


Built = tuple[int, RewriteResult, dict[str, Any], int | None]  # cost, model, details, predicted instructions


class CustomArenaCost:
    """Cost function of ``tfmcu.plan.search``: the predicted TFLM arena of the custom-mode model built with
    ``options`` (the kernel's op data and scratch included; ``tfmcu.plan.arena``, TFLM build ``build``).
    ``count_input=False`` subtracts the input image's buffer; ``budget``: the arena budget halo mode ``auto`` fits
    its caches under.

    Every patched plan is rewritten by ``rewrite_stages`` (a single stage is a list of one), each stage with its
    halo caches: those the plan fixed (the stage-plan search's), else the configuration's halo mode (none, all,
    smallest, auto).

    ``configs``: the joint search: every patched plan is evaluated in each configuration (a variant of the search,
    ``CustomOptions``) instead of ``options`` alone. ``instructions``: a latency predictor (a model -> predicted
    instructions per Invoke, ``tfmcu.plan.latency``) that every evaluation then carries (``Evaluation.instructions``),
    for the search's ``latency`` objective and ``max_latency``.

    ``persistent_room``: a region of its own for TFLM's persistent data (the bytes a tail may have there, the
    deploy margin applied; ``Target.persistent_ram``, the STM32F405's CCM): a model whose tail fits it is predicted
    with the tail apart and costs only its head, the rest what the one arena would (the bytes the budget's region
    holds, either way).

    A plan is priced from the rewritten model as the writer decides it, before any byte is written
    (``RewriteResult.decided``: what the arena and latency predictors read of its file); the model of an evaluation
    is written only when its bytes are asked for (``Evaluation.result.model``: the search's finalists)."""

    what = "predicted TFLM arena with the TFMCU_PATCH_STAGE kernel"

    def __init__(self, data: bytes, graph: ir.Graph, where: str = "model", *,
                 options: CustomOptions = CustomOptions(), count_input: bool = True, budget: int | None = None,
                 configs: Sequence[CustomOptions] = (), build: str = "wheel",
                 instructions: Callable[[bytes | TfliteModel], int] | None = None,
                 persistent_room: int | None = None):
        self.data, self.graph, self.where = data, graph, where
        self.persistent_room = persistent_room
        self.options, self.count_input, self.budget = options.validate(), count_input, budget
        configs = {c.validate().label: c for c in configs}  # (one per label)
        self.variants: tuple[CustomOptions | None, ...] = tuple(configs.values()) or (None,)
        self.build, self.instructions = get_build(build).name, instructions
        self._source: TfliteModel | None = None
        self._caches: dict[tuple[Any, ...], HaloCaches | None] = {}
        self._persistent: dict[int, tuple[int, bool]] | None = None
        self._pools: set[int] | None = None
        self._built: dict[tuple[Any, ...], Built] = {}

    def _tail_bound(self, plan: Plan, o: CustomOptions) -> int:
        """A floor under the custom model's persistent tail: what the operators outside the stages allocate in TFLM
        (op data, parsed options, Prepare's buffers; ``tfmcu.plan.arena.op_allocations``), which the rewrite leaves
        as they are -- except the convolutions ``rest_convs=tfmcu`` may move to our kernel (counted 0)."""
        if self._persistent is None:
            tb = get_build(self.build)
            pools = self._moved_pools()
            self._persistent = {}
            for k, op in enumerate(self.graph.ops):
                self._persistent[k] = (persistent_bytes(op_allocations(self.graph, op, tb)),
                                       builtin_of(op) in FLASH_OPS or k in pools)
        stages = {k for s in plan.schedules() for k in s.stage}
        return sum(size for k, (size, movable) in self._persistent.items()
                   if k not in stages and not (movable and o.rest_convs == "tfmcu"))

    def segment_tail(self, segment: Segment) -> int:
        """An estimate of the TFLM tail a stage plan's segment adds (``tfmcu.plan.arena.operator_tail``; the
        stage-plan search weighs it): a patch stage is one TFMCU_PATCH_STAGE op with its blob and output records;
        an op per layer is TFLM's, with its output and constant records, or ours where a configuration moves it
        (``rest_convs=tfmcu``) and ours is smaller (as ``convs_to_flash`` decides)."""
        tb = get_build(self.build)
        ours = operator_tail(stage_op_alloc(tb), 2, tb)
        if segment.patched:
            return ours
        op = self.graph.ops[segment.start]
        theirs = operator_tail(op_allocations(self.graph, op, tb), 1 + const_inputs(op, set()), tb)
        if not any(self.config(v).rest_convs == "tfmcu" for v in self.variants):
            return theirs
        if segment.start in self._moved_pools():  # it joins its convolution's stage
            return 0
        return min(ours, theirs) if builtin_of(op) in FLASH_OPS else theirs

    def _moved_pools(self) -> set[int]:
        """The global pools ``rest_convs=tfmcu`` moves into their convolution's one-layer stage (``pool_after``)."""
        if self._pools is None:
            consumers = self.graph.consumers()
            self._pools = {p for k in range(len(self.graph.ops))
                           if (p := pool_after(self.graph, k, consumers)) is not None}
        return self._pools

    @property
    def source(self) -> TfliteModel:
        """The model, parsed once for every rewrite (each edits a structural copy: ``tfmcu.tflite.editor.fork``)."""
        if self._source is None:
            self._source = as_model(self.data, self.where)
        return self._source

    def config(self, variant: CustomOptions | None) -> CustomOptions:
        """The configuration of a variant (None: ``options``)."""
        return self.options if variant is None else variant

    def _input_bytes(self, o: CustomOptions, patched: bool = False) -> int:
        """What the cost leaves out: the image's arena buffer when not counted (a streamed stage has none)."""
        if self.count_input or (patched and o.stream_input):
            return 0
        return sum(-(-self.graph.tensors[t].nbytes // 16) * 16 for t in self.graph.inputs)

    def _predict(self, result: RewriteResult) -> Any:
        """The arena of the decided model (as its file's would be: ``predict_model_arena``); nothing is written. With
        a ``persistent_room`` the tail goes apart where it fits there."""
        stages = result.stages if get_build(self.build).cmsis_nn else None
        return self._apart(lambda apart: predict_model_arena(result.decided, build=self.build, stage=stages,
                                                             persistent_apart=apart))

    def _apart(self, predict: Callable[[bool], Any]) -> Any:
        if self.persistent_room is not None:
            p = predict(True)
            if p.tail <= self.persistent_room:
                return p
        return predict(False)

    def _cost(self, p: Any, o: CustomOptions, patched: bool = False) -> int:
        """The cost of a prediction ``p``: the arena's bytes in the budget's region (its head alone when its tail is
        apart), less the image when it is not counted."""
        apart = bool(p.details.get("persistent_apart"))
        return (p.head if apart else p.total) - self._input_bytes(o, patched)

    def _image(self, o: CustomOptions) -> str:
        return "streamed" if o.stream_input else ("counted" if self.count_input else "excluded")

    def _analytic_caches(self, plan: Plan, k: int, halo: HaloOptions, image: str) -> HaloCaches | None:
        """Stage ``k``'s halo caches in an analytic mode of ``halo`` (``all``, ``smallest``; for ``auto``, whose
        caches depend on the predicted arena, every cache: its fewest MACs), once per plan; None: none (or not
        buildable)."""
        key = (id(plan), k, halo.mode if halo.mode != "smallest" else f"smallest {halo.mac_cap}", image)
        if key not in self._caches:
            try:
                mode = HaloOptions(mode="all") if halo.mode == "auto" else halo
                self._caches[key] = select(plan.schedules()[k], mode, None, image) if halo.caches else None
            except ScheduleError:
                self._caches[key] = None
        return self._caches[key]

    def variant_macs(self, plan: Plan, variant: CustomOptions | None) -> int:
        """The plan's MACs in a variant, for the search's order: with every halo cached (``all``, and ``auto`` at
        best) in the stages whose caches the configuration chooses, each element is computed once; ``smallest``
        recomputes some halos (its MACs are known only once its caches are chosen: the recompute count stands for
        them)."""
        o = self.config(variant)
        if o.halo.mode not in ("all", "auto"):
            return plan.macs
        caches = {k: self._analytic_caches(plan, k, o.halo, self._image(o)) for k in plan.open_stages}
        return _with_caches(plan, {k: h for k, h in caches.items() if h is not None})[0]

    def evaluate(self, plan: Plan, variant: CustomOptions | None) -> Evaluation:
        """The plan's predicted arena (and instructions, with a latency predictor). Each stage's caches: the plan's
        own, or the configuration's halo mode: ``none`` recomputes, ``all`` and ``smallest`` choose their caches
        analytically, ``auto`` needs the recompute model's prediction as its reference and builds each choice it
        tries once. ``rest_convs=tfmcu`` then moves the chosen model's convolutions (the model predicted). Each
        (plan, caches, memory plan, streaming, rest convs) is built and predicted once."""
        o = self.config(variant)
        if not plan.patched:  # the per-layer model in TFLM
            p = self._apart(lambda apart: predict_arena(self.graph, model=self.data, build=self.build,
                                                        persistent_apart=apart))
            return Evaluation(plan, None, self._cost(p, o), None, _details(p), self._instructions(self.data))
        schedules = plan.schedules()
        # (a first stage of several passes reads its input in each: it holds it whole, never streams it)
        stream = o.stream_input and plan.stages[0].start == 0 and plan.schedules()[0].passes.count == 1
        built: dict[Any, RewriteResult] = {}  # halo caches -> the model: each (plan, caches) rewritten once
        predicted: dict[Any, Any] = {}  # and predicted at most once

        def build(caches: tuple[HaloCaches | None, ...]) -> RewriteResult:
            key = _caches_key(caches)
            if key not in built:
                built[key] = rewrite_stages(self.source, self.graph, list(zip(schedules, caches)), self.where,
                                            inplace=o.inplace, streamed_input=stream, kernels=o.kernels,
                                            core=o.core)
            return built[key]

        def predict(caches: tuple[HaloCaches | None, ...]) -> Any:
            key = _caches_key(caches)
            if key not in predicted:
                predicted[key] = self._predict(build(caches))
            return predicted[key]

        image = self._image(o)
        chosen: list[HaloCaches | None] = []
        for k, (s, seg) in enumerate(zip(schedules, plan.stages)):
            halo = seg.halo_with(o.halo)
            h: HaloCaches | None = None
            if halo.mode == "auto":  # (the later stages recompute while it is chosen)
                before, later = tuple(chosen), (None,) * (len(schedules) - k - 1)
                h = self._auto_caches(s, o, image, lambda c, a=before, z=later: predict((*a, c, *z)))
            elif halo.caches:  # all, smallest: analytic choices (smallest's MAC cap not met: the user's to change)
                h = self._analytic_caches(plan, k, halo, image) or select(s, halo, None, image)
            chosen.append(h)
        caches = tuple(chosen)
        key = (id(plan), _caches_key(caches), o.inplace, stream, o.rest_convs, o.kernels, o.core)
        if key not in self._built:
            result = build(caches)
            configured = {k: caches[k] for k in plan.open_stages if caches[k] is not None}
            extra: dict[str, Any] = {"mac_overhead_exact": round(_with_caches(plan, configured)[1], 6)}
            for h in configured.values():  # (a plan leaves one stage's caches to the configuration: a single stage)
                extra["halo"] = h.to_dict()
            extra.update(plan.stage_plan_field())
            if o.rest_convs == "tfmcu":
                result, extra["rest_convs"] = self._rest_convs(result, o)
                p = self._predict(result)
            else:
                p = predict(caches)
            self._built[key] = (self._cost(p, o, stream), result,
                                {**_details(p), "ops": result.ops_after, **extra}, self._instructions(result.decided))
        cost, result, details, ins = self._built[key]
        return Evaluation(plan, variant, cost, result, dict(details), ins)

    def _rest_convs(self, result: RewriteResult, o: CustomOptions) -> tuple[RewriteResult, dict[str, int]]:
        """``rest_convs=tfmcu``: the rewritten model's remaining convolutions by our kernels (``convs_to_flash``),
        and what moved."""
        flash = convs_to_flash(result.decided, self.where, inplace=o.inplace, kernels=o.kernels, stages=result.stages,
                               build=self.build if self.build.startswith("cortex-m") else "cortex-m", core=o.core)
        moved = sum(e["tflm_persistent_bytes"] - e["tfmcu_persistent_bytes"] for e in flash.replaced)
        return (RewriteResult(flash.decided, result.ops_before, result.ops_after, result.new_tensors, result.schedule,
                              flash.stages),
                {"replaced": len(flash.replaced), "kept": len(flash.kept), "tflm_persistent_bytes_moved": moved})

    def _instructions(self, model: bytes | TfliteModel) -> int | None:
        return None if self.instructions is None else int(self.instructions(model))

    def _auto_caches(self, s: PatchSchedule, o: CustomOptions, image: str,
                     predict: Callable[[HaloCaches | None], Any]) -> HaloCaches:
        """Halo ``auto``'s caches. Their analytic budget: the arena budget less what TFLM adds to the analytic peak
        (persistent data, alignment, the rest of the graph's plan) in the recompute model's prediction; lowered by
        any overshoot of the prediction and tried again (at most four choices). Without a budget, the arena's head
        (activations and scratch) stays within the recompute model's: only the cache tables' three tensor records
        are added to the tail. ``predict`` builds each choice's model once (the recompute model: None)."""
        recompute = predict(None)
        analytic = halo_caches(s).peak(image)
        if self.budget is not None:
            analytic = self.budget - max(self._cost(recompute, o, True) - analytic, 0)
        for _ in range(4):
            try:
                caches = select(s, o.halo, analytic, image)
            except ScheduleError:  # not even the recompute schedule fits: no cache
                caches = halo_caches(s)
            assert caches is not None
            p = predict(caches)
            over = (p.head - recompute.head if self.budget is None else self._cost(p, o, True) - self.budget)
            if over <= 0 or not (caches.cache_rows or caches.cache_cols):
                break
            analytic -= over
        return caches

    def lower_bound(self, plan: Plan, variant: CustomOptions | None) -> int:
        """A floor under the predicted arena. A stage whose caches the plan fixed: its analytic peak, unless it
        reads the image (which the configuration may stream: 0). A stage whose caches the configuration chooses:
        its analytic peak (input + stage output + one patch's working set <= input + output + scratch; with the
        caches of an analytic halo mode, their peak), and, for a disjoint plan of the rest, the rest's analytic peak
        (<= its planned head), on top of the persistent tail of the ops outside the stages (not with a
        ``persistent_room``: a tail apart costs nothing)."""
        o = self.config(variant)
        bound, open_stages = 0, plan.open_stages
        for k, seg in enumerate(plan.stages):
            if k not in open_stages:
                bound = max(bound, seg.peak if seg.start > 0 else 0)
                continue
            s = plan.schedules()[k]
            counted = self.count_input and not o.stream_input
            stage = s.stage_peak_bytes if counted else s.stage_peak_bytes - s.input_bytes
            if o.halo.caches:  # caches can make the stage smaller than the recompute schedule's
                h = self._analytic_caches(plan, k, o.halo, self._image(o)) if o.halo.mode == "all" else None
                stage = 0 if h is None else h.stage_peak(self._image(o))  # (the other modes: costly to know)
            if not o.inplace:  # an in-place plan of the rest can go below its analytic peak
                stage = max(stage, s.rest_peak_bytes)
            bound = max(bound, stage + (0 if self.persistent_room is not None else self._tail_bound(plan, o)))
        return bound


def _caches_key(caches: Sequence[HaloCaches | None]) -> tuple[Any, ...]:
    return tuple(None if h is None else (h.cache_rows, h.cache_cols) for h in caches)


def _with_caches(plan: Plan, caches: dict[int, HaloCaches]) -> tuple[int, float]:
    """The plan's MACs and MAC overhead with halo caches on some of its stages (by index; exact MACs): its own
    figures without any."""
    if not caches:
        return plan.macs, plan.mac_overhead
    g = plan.graph
    base = sum(ir.op_macs(g, op) for op in g.ops)
    extra = 0
    for k, seg in enumerate(plan.stages):
        if k in caches:
            extra += caches[k].stage_macs_exact - caches[k].schedule.stage_macs
        else:
            extra += seg.macs - sum(ir.op_macs(g, g.ops[i]) for i in range(seg.start, seg.stop))
    return base + extra, extra / base if base else 0.0
