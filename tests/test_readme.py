"""README and docs/ say what the code does: what `make test` runs, how the firmware compares outputs, the demo's
duration stated once, no placeholder in a flag's help, no machine path in any tracked file, the in-place plan
figures they quote are the ones `make bench` prints, the module list matches the tree, and every command they show
names only flags that exist. (Pages, links, README's length and the figures rendered from results:
tests/test_docs.py.)"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


README = _read("README.md")
DOCS = {os.path.relpath(p, ROOT): open(p).read() for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))}
PAGES = {"README.md": README, **DOCS}
PIPELINES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "pipelines", "*.py"))
                   if not os.path.basename(p).startswith("_"))


def _section(text: str, title: str) -> str:
    """``title``'s section of ``text``, up to the next heading of any level."""
    start = text.index(title)
    nxt = re.search(r"^#+ ", text[start + len(title):], re.M)
    return text[start:start + len(title) + (nxt.start() if nxt else len(text))]


def test_make_test_runs_every_test():
    """README promises every test in `make test`: no test is gated on an environment variable, none is manual."""
    gated = []
    for folder, _, files in os.walk(os.path.join(ROOT, "tests")):
        for f in files:
            if f.endswith(".py") and f != os.path.basename(__file__):
                text = open(os.path.join(folder, f)).read()
                gated += [f"{f}: {m}" for m in re.findall(r"environ(?:\.get)?[\[(]\"(TFMCU_[A-Z_]*TESTS?)\"", text)]
    assert not gated, gated
    rc = open(os.path.join(ROOT, ".bazelrc")).read()
    assert "TFMCU_FULL_TESTS" not in rc
    assert "make test` runs every test" in README and "nothing is skipped" in _section(DOCS["docs/testing.md"],
                                                                                          "## make test")


def test_firmware_comparison_is_described_as_a_hash():
    text = _section(DOCS["docs/firmware.md"], "## Cortex-M firmware under QEMU")
    assert not any("compares the output bytes" in t for t in PAGES.values()) and "hash of the output bytes" in text


def test_demo_duration_is_stated_once_and_the_same_everywhere():
    durations: set[str] = set()
    for text in (README, DOCS["docs/getting-started.md"], _read("tfmcu/flows/demo.py"), _read("pipelines/demo.py")):
        durations |= set(re.findall(r"about (\d+) minutes on 2 (?:CPU )?cores", text))
    assert len(durations) == 1, durations


def test_flag_help_has_no_placeholders():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for pipeline in ("rewrite", "profile", "verify", "demo", "train", "bench"):
        r = subprocess.run([sys.executable, "-m", f"pipelines.{pipeline}", "--help"], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=120)
        # absl prints the help and exits with status 1.
        assert r.returncode in (0, 1) and "Try --helpfull" in r.stdout, r.stderr[-1000:]
        assert "later issue" not in r.stdout and "(todo" not in r.stdout.lower(), pipeline


def test_no_machine_path_in_tracked_files():
    pattern = re.compile(r"(^|[^A-Za-z0-9_.])/(work|farm|home|root)/")
    found = []
    for top in ("tfmcu", "pipelines", "benchmarks", "tests", "tools", "tflm_patch_kernels", "docs"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".c", ".h", ".bzl", ".sh", ".ld", ".md")) or f == "BUILD":
                    path = os.path.join(folder, f)
                    for n, line in enumerate(open(path, errors="replace"), 1):
                        if pattern.search(line) and path != os.path.abspath(__file__):
                            found.append(f"{os.path.relpath(path, ROOT)}:{n}")
    for f in (".bazelrc", "Makefile", "WORKSPACE", "BUILD", "README.md"):
        for n, line in enumerate(open(os.path.join(ROOT, f)), 1):
            if pattern.search(line):
                found.append(f"{f}:{n}")
    assert not found, found


def test_quoted_inplace_figures_are_what_bench_prints(zoo_models):
    """The in-place pairs and lower bound docs/memory.md quotes come from `make bench` (section custom), which prints
    them with the same function as here."""
    from benchmarks.sections import inplace_figures, inplace_line
    from tfmcu.graph.from_tflite import from_tflite

    figures = inplace_figures("mbv2_035_96, whole model (the in-place pairs the tests check in TFLM)",
                              from_tflite(zoo_models("mbv2_035_96")))
    assert figures["pairs"] > 40
    assert inplace_line(figures) in DOCS["docs/memory.md"]


def _layout() -> str:
    return _section(DOCS["docs/design.md"], "## Layout")


def test_layout_section_matches_the_tree():
    """Every module of tfmcu/, pipelines/ and benchmarks/ has its line in docs/design.md's layout, under its
    package."""
    layout = _layout()
    missing = []
    for pkg in ("tfmcu", "pipelines", "benchmarks"):
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            rel = os.path.relpath(folder, ROOT)
            for f in sorted(files):
                if not f.endswith(".py") or f == "__init__.py":
                    continue
                if rel in ("tfmcu", "pipelines"):
                    ok = f"`{rel}/{f}`" in layout or (rel == "pipelines" and f"`{f}`" in layout)
                else:
                    block = layout.split(f"`{rel}/`", 1)[1].split("\n- ", 1)[0] if f"`{rel}/`" in layout else ""
                    ok = f"`{f}`" in block
                if not ok:
                    missing.append(f"{rel}/{f}")
    assert os.path.isdir(os.path.join(ROOT, "benchmarks")) and "`benchmarks/`" in layout
    assert not missing, missing


def test_layout_names_only_modules_that_exist():
    """The other way round: every Python module the layout names under a package is in that package."""
    stale = []
    for block in re.split(r"\n- ", _layout())[1:]:
        m = re.match(r"`([\w/]+)/`", block)
        if not m or not os.path.isdir(os.path.join(ROOT, m.group(1))):
            continue
        for name in re.findall(r"`([\w./]+\.py)`", block):
            if "/" in name and not name.startswith(m.group(1) + "/"):
                continue  # a file of another folder, named in passing (Bazel's runfiles may not hold it)
            path = name if "/" in name else os.path.join(m.group(1), name)
            if not os.path.exists(os.path.join(ROOT, path)):
                stale.append(path)
    assert not stale, stale


def _commands(text: str) -> list[tuple[str, str]]:
    """(pipeline, arguments) of every ``python -m pipelines.NAME ...`` in code blocks and inline code, and of
    inline code that starts with a pipeline's name and a flag (`rewrite --inplace`)."""
    found = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        for line in re.sub(r"\\\n\s*", " ", block).split("\n"):
            for m in re.finditer(r"python -m pipelines\.([a-z_]+)((?: +[^ #]\S*)*)", line):
                found.append((m.group(1), m.group(2)))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for code in re.findall(r"`([^`]+)`", prose):  # inline code may wrap onto the next line
        m = re.match(r"(?:python -m pipelines\.)?([a-z_]+) (--.*)", code.replace("\n", " "))
        if m and (code.startswith("python -m pipelines.") or m.group(1) in PIPELINES):
            found.append((m.group(1), m.group(2)))
    return found


def _flag_names(pipeline: str) -> set[str]:
    code = ("import importlib, sys; from absl import app, flags; importlib.import_module('pipelines.' + sys.argv[1]); "
            "app.define_help_flags(); print(' '.join(flags.FLAGS))")  # --help, --helpfull: defined by app.run
    r = subprocess.run([sys.executable, "-c", code, pipeline], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(r.stdout.split())


def test_commands_name_only_flags_that_exist():
    """Every flag of every command shown in README and docs/*.md is defined by that pipeline (`--noX` for a
    boolean X), and `bench --sections` names sections that exist."""
    from benchmarks.sections import SECTIONS

    commands = [(page, p, args) for page, text in PAGES.items() for p, args in _commands(text)]
    # docs/pipelines.md's "Flags: ..." paragraph of each pipeline's section, read as that pipeline's command line
    for section in re.split(r"^## ", DOCS["docs/pipelines.md"], flags=re.M)[1:]:
        name, listed = section.split("\n", 1)[0].strip(), re.search(r"^Flags\b.*?(?=\n\n)", section, re.M | re.S)
        if name in PIPELINES and listed:
            commands.append(("docs/pipelines.md", name, listed.group(0)))
    used = sorted({p for _, p, _ in commands})
    assert set(used) >= {"profile", "rewrite", "verify", "deploy", "train", "search", "bench"}, used
    unknown_pipelines = [p for p in used if p not in PIPELINES]
    assert not unknown_pipelines, unknown_pipelines
    with ThreadPoolExecutor(4) as pool:
        flags = dict(zip(used, pool.map(_flag_names, used)))
    bad = []
    for page, p, args in commands:
        for name, value in re.findall(r"(?<![\w-])--(\w+)(?:=(\S*))?", args):
            if name not in flags[p] and not (name.startswith("no") and name[2:] in flags[p]):
                bad.append(f"{page}: {p} --{name}")
            if p == "bench" and name == "sections" and value:
                bad += [f"{page}: bench --sections={s}" for s in value.split(",") if s not in SECTIONS]
    assert not bad, bad
