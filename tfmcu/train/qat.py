"""The TensorFlow side of training: distribution strategy, determinism, the optimizer, batch-norm re-calibration and
quantization-aware training (tensorflow-model-optimization). TensorFlow is imported inside the functions, so that a
bad setting fails before it loads."""

from __future__ import annotations

import json
import os
import weakref
from typing import Any

from tfmcu.nets.spec import NetSpec
from tfmcu.train.config import TrainError

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def make_strategy(name: str):
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise TrainError("--strategy=multi_worker needs TF_CONFIG (JSON with 'cluster' and 'task') on every "
                             "worker")
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise TrainError(f"TF_CONFIG is not valid JSON ({e.msg})") from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise TrainError(f"unknown strategy '{name}'; known: default, mirrored, multi_worker")


def is_chief(strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


def configure_determinism(seed: int, deterministic: bool) -> None:
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def quantize(model) -> tuple[Any, list[str]]:
    """``tfmot.quantization.keras.quantize_model`` for our builder's models; returns (QAT model, notes).

    Conv-BN-ReLU(6), depthwise-BN-ReLU(6), Add, zero padding, pooling and Dense are in tfmot's default 8-bit
    registry. The squeeze-excite ``Multiply`` is not: it is annotated with ``Default8BitOutputQuantizeConfig``
    (fake-quantize its output, as the int8 MUL kernel requires) -- configuration only, the model is unchanged."""
    import tensorflow_model_optimization as tfmot
    import tf_keras
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit.default_8bit_quantize_configs \
        import Default8BitOutputQuantizeConfig

    qk = tfmot.quantization.keras
    multiply = [layer.name for layer in model.layers if isinstance(layer, tf_keras.layers.Multiply)]
    notes = []
    try:
        if not multiply:
            return qk.quantize_model(model), notes

        def annotate(layer):
            if isinstance(layer, tf_keras.layers.Multiply):
                return qk.quantize_annotate_layer(layer, Default8BitOutputQuantizeConfig())
            return layer  # the same layer object: weights are shared, not copied

        annotated = qk.quantize_annotate_model(tf_keras.models.clone_model(model, clone_function=annotate))
        with qk.quantize_scope({"Default8BitOutputQuantizeConfig": Default8BitOutputQuantizeConfig}):
            qat = qk.quantize_apply(annotated)
        notes.append(f"{len(multiply)} Multiply layer(s) (squeeze-excite) quantized with "
                     f"Default8BitOutputQuantizeConfig (not in tfmot's default 8-bit registry)")
        return qat, notes
    except (RuntimeError, ValueError) as e:
        raise TrainError(f"QAT: tfmot cannot quantize {model.name}: {str(e).splitlines()[0]}") from None


def make_optimizer(lr: float, momentum: float, nesterov: bool, weight_decay: float, total_steps: int,
                   warmup_steps: int = 0, kind: str = "sgd"):
    import tf_keras

    total_steps = max(1, int(total_steps))
    warmup_steps = min(int(warmup_steps), total_steps - 1) if total_steps > 1 else 0
    if warmup_steps > 0:
        schedule = tf_keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=lr * 0.01, decay_steps=total_steps - warmup_steps, alpha=0.0,
            warmup_target=lr, warmup_steps=warmup_steps)
    else:
        schedule = tf_keras.optimizers.schedules.CosineDecay(initial_learning_rate=lr, decay_steps=total_steps,
                                                             alpha=0.0)
    if kind == "adam":  # (Keras' weight decay is decoupled, AdamW's: w -= lr * wd * w)
        opt = tf_keras.optimizers.Adam(learning_rate=schedule, weight_decay=weight_decay or None)
    else:
        opt = tf_keras.optimizers.SGD(learning_rate=schedule, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay or None)
    if weight_decay:
        # Decay conv / depthwise / dense kernels only: not batch-norm scales and shifts, biases or quantizer ranges.
        opt.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "_min", "_max", "min_var", "max_var"])
    return opt


def current_lr(opt) -> float:
    lr = opt.learning_rate
    if callable(lr):
        return float(lr(opt.iterations))
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


def compile_model(model, opt, label_smoothing: float) -> None:
    import tf_keras

    model.compile(optimizer=opt,
                  loss=tf_keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
                  metrics=[tf_keras.metrics.CategoricalAccuracy(name="accuracy")])


_RECAL_STEPS: "weakref.WeakKeyDictionary[Any, dict[float, Any]]" = weakref.WeakKeyDictionary()


def recalibrate_bn(model, batches, n: int, strategy=None) -> None:
    """Re-estimate every batch norm's moving mean / variance for the current weights (MCUNetV2 re-calibrates BN
    statistics the same way): forward passes in training mode over ``n`` fixed batches, the first with momentum 0
    (its statistics replace the stale ones), the others with momentum 0.9. Weights are not touched. Short runs need
    it: the moving averages lag far behind weights that change quickly, and the error compounds with depth.

    The two forward functions are traced once per model and cached (BN reads its momentum when traced), so
    re-calibrating every epoch costs only the forward passes."""
    import tensorflow as tf
    import tf_keras

    bns = [layer for layer in _all_layers(model) if isinstance(layer, tf_keras.layers.BatchNormalization)]
    if not bns or n <= 0:
        return
    strategy = strategy or tf.distribute.get_strategy()
    fns = _RECAL_STEPS.setdefault(model, {})

    def make_step():
        @tf.function
        def step(x):
            def fwd(xs):
                model(xs, training=True)
                return tf.constant(0)
            return strategy.run(fwd, args=(x,))
        return step

    images = batches.map(lambda x, y: x).take(n)
    if strategy.num_replicas_in_sync > 1:
        images = strategy.experimental_distribute_dataset(images)
    saved = [b.momentum for b in bns]
    try:
        for i, x in enumerate(images):
            momentum = 0.0 if i == 0 else 0.9
            for b in bns:  # read when the step function is traced (first use), so set it before every call
                b.momentum = momentum
            if momentum not in fns:
                fns[momentum] = make_step()
            fns[momentum](x)
    finally:
        for b, m in zip(bns, saved):
            b.momentum = m


def _all_layers(model) -> list[Any]:
    """Layers, looking inside tfmot's QuantizeWrapper (which holds the real layer as ``.layer``)."""
    out = []
    for layer in model.layers:
        out.append(layer)
        inner = getattr(layer, "layer", None)
        if inner is not None:
            out.append(inner)
    return out




def build_model(spec: NetSpec, seed: int, bn_momentum: float | None = None):
    """``build_keras(spec, seed)``, with the batch-norm momentum set by configuration (not in the builder)."""
    import tf_keras

    from tfmcu.nets.keras_builder import build_keras  # lazy: imports TensorFlow

    model = build_keras(spec, seed)
    if bn_momentum is not None:
        for layer in model.layers:
            if isinstance(layer, tf_keras.layers.BatchNormalization):
                layer.momentum = bn_momentum
    return model
