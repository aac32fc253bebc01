"""Writes a derived firmware linker script (tfmcu.firmware.targets.DERIVED_LD: a build's script with other memory) to
stdout, for the genrule in tflm_patch_kernels/firmware/BUILD.

usage: gen_linker_script.py NAME      e.g. mps2_an505.ld
"""
import sys

from tfmcu.firmware.targets import DERIVED_LD, build_linker_script


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in DERIVED_LD:
        sys.stderr.write(f"usage: gen_linker_script.py NAME (one of {', '.join(DERIVED_LD)})\n")
        return 2
    sys.stdout.write(build_linker_script(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
