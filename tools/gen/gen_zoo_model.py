"""Converts a tfmcu.nets.zoo model to its int8 .tflite once, for every generator of a firmware that reads it
(gen_model_whole.py, gen_model_stage.py with --tflite): the conversion is the slow part of a generator (TensorFlow
builds and converts the Keras model), and the Bazel build runs each generator once per firmware.

usage: gen_zoo_model.py --model NAME --out OUT.tflite
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_common import ROOT  # noqa: E402,F401  (sets the environment and sys.path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a tfmcu.nets.zoo model name")
    ap.add_argument("--out", required=True, help="the .tflite to write")
    a = ap.parse_args(argv)
    from tfmcu.nets import zoo

    if a.model not in zoo.ZOO:
        ap.error(f"--model={a.model}: not a zoo model (known: {', '.join(zoo.ZOO)})")
    data = zoo.build(a.model, None)
    with open(a.out, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
