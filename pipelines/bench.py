"""`make bench`: long measurements that do not belong in `make test` (library: ``benchmarks.sections``). Each section
writes out/bench/<section>.json (rows for scripts) and out/bench/<section>.md (the table); pick with --sections.

    python -m pipelines.bench --sections=rewrite,custom,firmware,train
"""

from __future__ import annotations

from typing import Sequence

from absl import flags

from benchmarks import sections as bench
from pipelines import _cli

FLAGS = flags.FLAGS
_D = bench.BenchOptions()  # the flags' defaults
_cli.define_out_dir(_D.out_dir)
flags.DEFINE_list("sections", list(_D.sections),
                  "Sections to run (train alone takes about 1.5 h on 2 CPU cores, resolution about 15 min).")
flags.DEFINE_string("zoo_cache", _D.zoo_cache, "Cache of converted zoo models.")
flags.DEFINE_integer("check_samples", _D.samples, "Random inputs for the bit-exactness checks.", lower_bound=1)
flags.DEFINE_list("fit_models", list(_D.fit_models),
                  "Section fit: only these models (default: all of benchmarks.fit.CASES).")
flags.DEFINE_list("fit_caps", list(_D.fit_caps), "Section fit: only these --max_latency caps, 'none' for no cap (default: "
                                 "1.00,1.05,1.25,none).")

flags.DEFINE_list("foreign_models", list(_D.foreign_models),
                  "Section foreign: only these models (default: all of benchmarks.foreign_models.MODELS).")
flags.DEFINE_list("foreign_targets", list(_D.foreign_targets),
                  "Section foreign: only these targets (default: cortex-m4,cortex-m7,cortex-m55).")

flags.DEFINE_list("speed_models", list(_D.speed_models),
                  "Section speed: only these models (default: all of benchmarks.speed.MODELS).")
flags.DEFINE_list("speed_cores", list(_D.speed_cores),
                  "Section speed: only these cores (default: cortex-m3,cortex-m4,cortex-m7,cortex-m33,cortex-m55).")

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> None:
    bench.run(bench.BenchOptions(out_dir=FLAGS.out_dir, sections=tuple(FLAGS.sections), zoo_cache=FLAGS.zoo_cache,
                                 samples=FLAGS.check_samples, fit_models=tuple(FLAGS.fit_models),
                                 fit_caps=tuple(FLAGS.fit_caps), foreign_models=tuple(FLAGS.foreign_models),
                                 foreign_targets=tuple(FLAGS.foreign_targets),
                                 speed_models=tuple(FLAGS.speed_models), speed_cores=tuple(FLAGS.speed_cores)))


if __name__ == "__main__":
    _cli.run(main)
