r"""Joint architecture + patch-schedule search (MCUNetV2 section 3.3; library: ``tfmcu.flows.search``).

    python -m pipelines.search --sram_kb=256 --flash_kb=1024                  # scenes task, mcunet-demo stages
    python -m pipelines.search --sram_kb=128 --resolutions=64,96,128,160 --population=100 --parents=20 \
        --mutations=50 --crossovers=50 --iterations=30                         # the paper's evolution settings
    python -m pipelines.train --model=out/search/best.json --init_weights=out/search/best.weights.h5 \
        --dataset=scenes --epochs=10 --lr=0.005                               # fine-tune the winner, QAT, int8

Trains a weight-sharing supernet over the search space (elastic kernel 3/5/7, expansion, width, depth per stage,
resolution) on --dataset, then searches sub-networks by evolution under --sram_kb (the predicted TFLM arena of the
int8 model in custom mode, with the least-MACs patch schedule that fits; the input image counted unless
--nocount_input), --flash_kb and --max_mmacs, scoring each by the supernet's held-out accuracy; and, for comparison,
the same search with per-layer execution only. Resumable (rerun the same command). Writes under --out_dir:
best.json, best.weights.h5, best_schedule.json (and best_per_layer.*), search_report.json, pareto.png, supernet/
and the search states. --search_workers=N evaluates candidates in N processes; --strategy trains the supernet
distributed (docs/search.md: a bigger search on several machines). --base is the space's base network (a preset or
spec); the supernet's --supernet_batch_size, --supernet_lr and --supernet_steps_per_epoch are its own (train's
--batch_size, --lr and --steps_per_epoch are the final training's).
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from pipelines import _cli
from tfmcu.flows import search
from tfmcu.nas.evolution import EvolutionOptions
from tfmcu.nas.train_supernet import SupernetRecipe
from tfmcu.runtime.capture import import_tensorflow_quietly

FLAGS = flags.FLAGS
_D = search.SearchRunOptions()  # the flags' defaults: the run's, its supernet recipe's, its evolution's, its space's
_R, _E, _S = _D.supernet, _D.evolution, _D.space
_cli.define_out_dir(_D.out_dir)
_cli.define_seed_flag()
flags.DEFINE_string("base", _D.model, "The base the search space varies: a preset or spec JSON (stem, head, stage "
                                     "channels, strides).")
_cli.define_training_flag("dataset", _D.dataset)
_cli.define_training_flag("data_dir", _D.data_dir)
_cli.define_budget_flag(_D.sram_kb, "the predicted TFLM arena of a candidate's int8 model, custom mode")
flags.DEFINE_float("flash_kb", _D.flash_kb, "Flash limit: the int8 .tflite with its metadata.")
flags.DEFINE_float("max_mmacs", _D.max_mmacs, "MAC limit in millions (patch overhead included).")
_cli.define_count_input_flag(_D.count_input)
_cli.define_grids_flag(_D.patch_options, "Patches per side the schedules may use (PxQ grids, 1: none).")
_cli.define_max_stages_flag()
flags.DEFINE_bool("compare_per_layer", _D.compare_per_layer,
                  "Also run the search restricted to p = 1 (per-layer only).")
flags.DEFINE_list("kernel_sizes", [f"{v:g}" for v in _S.kernels], "Search space: depthwise kernel sizes.")
flags.DEFINE_list("expands", [f"{v:g}" for v in _S.expands], "Search space: expansion ratios.")
flags.DEFINE_list("depths", [f"{v:g}" for v in _S.depths], "Search space: blocks per stage.")
flags.DEFINE_list("widths", [f"{v:g}" for v in _S.widths], "Search space: per-block width multipliers.")
flags.DEFINE_list("resolutions", [f"{v:g}" for v in _S.resolutions], "Search space: input resolutions.")
flags.DEFINE_integer("largest_epochs", _R.largest_epochs,
                     "Supernet: epochs of the largest network before channel sorting.", lower_bound=0)
flags.DEFINE_integer("supernet_epochs", _R.epochs, "Supernet: epochs of sampled sub-networks.", lower_bound=0)
flags.DEFINE_integer("supernet_batch_size", _R.batch_size, "Supernet batch size.", lower_bound=1)
flags.DEFINE_float("supernet_lr", _R.lr, "Supernet peak learning rate (SGD, cosine).", lower_bound=0)
flags.DEFINE_integer("random_subnets", _R.random_subnets,
                     "Random sub-networks per step besides the largest (paper: 4).", lower_bound=0)
flags.DEFINE_integer("supernet_steps_per_epoch", _R.steps_per_epoch, "Cap the supernet steps per epoch.",
                     lower_bound=1)
flags.DEFINE_integer("calibration_batches", _R.calibration_batches,
                     "BN re-calibration batches per sub-network (paper: 20).", lower_bound=1)
flags.DEFINE_integer("calibration_batch_size", _R.calibration_batch_size, "BN re-calibration batch size (paper: 64).",
                     lower_bound=1)
flags.DEFINE_integer("eval_samples", _R.eval_samples,
                     "Held-out samples per sub-network (not given: the whole split).", lower_bound=1)
flags.DEFINE_integer("population", _E.population, "Evolution: population (paper: 100).", lower_bound=2)
flags.DEFINE_integer("parents", _E.parents, "Evolution: parents kept per iteration (paper: 20).", lower_bound=1)
flags.DEFINE_integer("mutations", _E.mutations, "Evolution: children by mutation per iteration (paper: 50).",
                     lower_bound=0)
flags.DEFINE_integer("crossovers", _E.crossovers, "Evolution: children by crossover per iteration (paper: 50).",
                     lower_bound=0)
flags.DEFINE_float("mutation_rate", _E.mutation_rate, "Evolution: per-gene mutation probability (paper: 0.1).",
                   lower_bound=0, upper_bound=1)
flags.DEFINE_integer("iterations", _E.iterations, "Evolution: iterations (paper: 30).", lower_bound=0)
_cli.define_training_flag("strategy", _D.strategy)  # the supernet's training (multi_worker reads TF_CONFIG)
_cli.define_search_workers_flag(_D.workers)

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help


def main(argv: Sequence[str]) -> None:
    space = search.parse_space(FLAGS.kernel_sizes, FLAGS.expands, FLAGS.depths, FLAGS.widths, FLAGS.resolutions)
    options = search.SearchRunOptions(
        model=FLAGS.base, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir, space=space, sram_kb=FLAGS.sram_kb,
        flash_kb=FLAGS.flash_kb, max_mmacs=FLAGS.max_mmacs, count_input=FLAGS.count_input,
        patch_options=_cli.grids(), max_stages=FLAGS.max_stages,
        compare_per_layer=FLAGS.compare_per_layer,
        supernet=SupernetRecipe(largest_epochs=FLAGS.largest_epochs, epochs=FLAGS.supernet_epochs,
                                batch_size=FLAGS.supernet_batch_size, lr=FLAGS.supernet_lr,
                                random_subnets=FLAGS.random_subnets, steps_per_epoch=FLAGS.supernet_steps_per_epoch,
                                calibration_batches=FLAGS.calibration_batches,
                                calibration_batch_size=FLAGS.calibration_batch_size, eval_samples=FLAGS.eval_samples),
        evolution=EvolutionOptions(population=FLAGS.population, parents=FLAGS.parents, mutations=FLAGS.mutations,
                                   crossovers=FLAGS.crossovers, mutation_rate=FLAGS.mutation_rate,
                                   iterations=FLAGS.iterations, seed=FLAGS.seed),
        seed=FLAGS.seed, out_dir=FLAGS.out_dir, strategy=FLAGS.strategy, workers=FLAGS.search_workers)
    search.validate(options)
    import_tensorflow_quietly()
    report = search.run(options, log=_cli.log_stderr, progress=_cli.progress)
    if report.get("chief") is False:
        print("supernet trained (this worker is not the chief: the chief searches and writes the outputs)")
        return
    for name, r in report["searches"].items():
        b = r["best"]
        print(f"{name}: held-out accuracy {b['accuracy']:.2%} (supernet), {b['resolution']} px, grid "
              f"{b['grid'][0]}x{b['grid'][1]}, predicted arena {b['arena_bytes'] / 1024:.1f} kB, Flash "
              f"{b['flash_bytes'] / 1024:.1f} kB, {b['macs'] / 1e6:.1f}M MACs"
              + (f" ({b['stage_plan']['describe']})" if b.get("stage_plan") else ""))
    per_layer = ", best_per_layer.*" if options.compare_per_layer else ""
    print(f"wrote {options.out_dir}/best.json, best.weights.h5, best_schedule.json{per_layer}, search_report.json, "
          f"pareto.png")


if __name__ == "__main__":
    _cli.run(main)
