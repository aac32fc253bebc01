"""The docs cannot disagree (``benchmarks.docs``): every figure table and every quoted figure of README.md and
docs/*.md is rendered from the JSON of the run that measured it, and a page that differs from its rendering fails
here, naming the page, the marker and the first differing line. Pages describe the product: no issue numbers,
commit hashes, session words or dates outside what a result renders; every relative link resolves; README is short;
every error class a user can meet is in docs/troubleshooting.md."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

import pytest

from benchmarks import docs, results
from benchmarks.sections import SECTION_TABLES, SECTIONS
from tfmcu.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = {p: open(os.path.join(ROOT, p)).read() for p in docs.pages(ROOT)}

# Pages with markers whose result is not published yet (the bench sections are re-run and published with
# `python -m benchmarks.docs --publish out/bench`, `make demo` with `--publish out/demo/summary.json --name demo`,
# then `python -m benchmarks.docs --write`). Empty it as results are published: an entry whose page no longer
# awaits anything fails below.
AWAITING_RESULTS: set[str] = set()


def _problems() -> list[docs.Problem]:
    return [p for page, text in PAGES.items() for p in docs.check_page(page, text, ROOT)]


def test_every_marker_renders_what_its_page_holds():
    problems = _problems()
    bad = [str(p) for p in problems if p.kind != "awaiting"]
    assert not bad, "\n".join(bad) + "\n(python -m benchmarks.docs --write renders them)"
    awaiting = {p.page for p in problems if p.kind == "awaiting"}
    unlisted = sorted(awaiting - AWAITING_RESULTS)
    assert not unlisted, [str(p) for p in problems if p.page in unlisted]
    stale = sorted(AWAITING_RESULTS - awaiting)
    assert not stale, f"these pages await no result any more: remove them from AWAITING_RESULTS: {stale}"


def test_pages_render_figures_from_results():
    """Every bench section's result is rendered on some page, and some markers already render from published
    results and match their pages."""
    used = docs.used_results(ROOT)
    missing = [name for name in list(SECTIONS) + ["latency_calibration", "demo"] if name not in used]
    assert not missing, f"no page renders these results: {missing}"
    markers = [m for text in PAGES.values() for m in docs.markers(text)]
    assert {m[0] for m in markers} == {"table", "value"}
    assert len(markers) - len(_problems()) >= 5  # rendered from published results, and equal to their pages


def _plant(text: str, marker: str, old: str, new: str) -> str:
    start = text.index(marker)
    end = text.index("<!-- /", start)
    i = text.index(old, start)
    assert i < end, (marker, old)
    return text[:i] + new + text[i + len(old):]


def test_a_planted_mismatch_in_a_table_is_reported(tmp_path):
    """A copy of a page with one figure changed in a rendered table fails, naming the page, the marker and the
    first differing line."""
    page = "docs/latency.md"
    text = PAGES[page]
    assert not docs.check_page(page, text, ROOT)
    planted = _plant(text, "<!-- table: latency_calibration:runs -->", "109,152,419", "109,152,418")
    copy = tmp_path / "latency.md"
    copy.write_text(planted)
    problems = docs.check_page(page, copy.read_text(), ROOT)
    assert len(problems) == 1, problems
    p = problems[0]
    line = planted[:planted.index("109,152,418")].count("\n") + 1
    assert (p.page, p.marker, p.kind, p.line) == (page, "table: latency_calibration:runs", "differs", line), p
    assert "109,152,418" in p.message and "109,152,419" in p.message, p.message
    assert f"{page}:{line}: table: latency_calibration:runs: differs" in str(p)


def test_a_planted_mismatch_in_a_value_is_reported(tmp_path):
    page = "docs/fit.md"
    text = PAGES[page]
    marker = "<!-- value: latency_calibration:worst_error|.2% -->"
    assert marker in text
    value = docs.render_value("latency_calibration:worst_error|.2%")
    planted = text.replace(marker + value, marker + "1.71%")
    assert planted != text
    copy = tmp_path / "fit.md"
    copy.write_text(planted)
    bad = [p for p in docs.check_page(page, copy.read_text(), ROOT) if p.kind == "differs"]
    assert len(bad) == 1 and bad[0].marker == "value: latency_calibration:worst_error|.2%", bad
    assert "1.71%" in bad[0].message and value in bad[0].message


def test_write_renders_a_page_back(tmp_path):
    text = PAGES["docs/latency.md"]
    planted = _plant(text, "<!-- table: latency_calibration:accuracy -->", "| cortex-m4 |", "| cortex-m0 |")
    assert docs.render_page(planted, ROOT) == text


def test_markers_name_known_tables_and_results():
    known = set(SECTIONS) | set(results.SOURCES) | set(docs.COMMANDS) | {
        n for t in list(docs.TABLES.values()) + list(docs.OPTIONAL.values()) for n in t.sources}
    for page, text in PAGES.items():
        for kind, spec, *_ in docs.markers(text):
            if kind == "table":
                assert spec in docs.TABLES or spec in docs.OPTIONAL, (page, spec)
            else:
                assert spec.partition(":")[0] in known, (page, spec)
    # every marker is closed: no opening marker is left over when the matched ones are removed
    for page, text in PAGES.items():
        rest = docs.VALUE_RE.sub("", docs.TABLE_RE.sub("", text))
        assert "<!-- table:" not in rest and "<!-- value:" not in rest, page


def test_every_bench_section_has_its_table_function():
    assert set(SECTION_TABLES) == set(SECTIONS)
    assert all(docs.TABLES[s].sources == (s,) for s in SECTIONS)


def test_published_results_are_used_and_record_their_run():
    used = docs.used_results(ROOT)
    for path in glob.glob(os.path.join(results.RESULTS_DIR, "*.json")):
        name = os.path.basename(path)[:-5]
        assert name in used, f"{name}: published but no page renders it"
        run = json.load(open(path)).get("run") or {}
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", run.get("date", "")) and run.get("host") and run.get("command"), \
            (name, run)


def test_value_paths():
    data = {"rows": [{"model": "a", "grid": [4, 4], "x": 1}, {"model": "b", "grid": [3, 4], "x": 1234567,
                                                             "ok": True, "f": 0.0123}]}
    assert docs.resolve(data, "rows[model=b,grid=3x4].x") == 1234567
    assert docs.resolve(data, "rows[-1].ok") is True
    with pytest.raises(docs.RenderError):
        docs.resolve(data, "rows[model=c].x")
    with pytest.raises(docs.RenderError):
        docs.resolve(data, "rows[2].x")


def test_publish_records_the_run(tmp_path):
    run = tmp_path / "summary.json"
    run.write_text(json.dumps({"model": "m", "files": [str(tmp_path / "out" / "m.tflite"),
                                                       os.path.join(ROOT, "out", "x.tflite"), "/elsewhere/y"]}))
    names = docs.publish(str(run), "demo", root=str(tmp_path))
    got = json.load(open(results.path_of("demo", str(tmp_path))))
    assert names == ["demo"] and got["model"] == "m" and got["run"]["command"] == "make demo", got
    # paths below the run's folder or the checkout are published relative: no machine's folders
    assert got["files"] == [os.path.join("out", "m.tflite"), os.path.join("out", "x.tflite"), "/elsewhere/y"]
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "custom.json").write_text(json.dumps({"section": "custom", "rows": [], "run": {"date": "d"}}))
    (bench / "notes.json").write_text("{}")
    assert docs.publish(str(bench), root=str(tmp_path)) == ["custom"]
    assert json.load(open(results.path_of("custom", str(tmp_path))))["run"] == {"date": "d"}
    with pytest.raises(UsageError, match="no such file"):
        docs.publish(str(tmp_path / "nothing.json"), root=str(tmp_path))
    (tmp_path / "other.json").write_text("[]")
    with pytest.raises(UsageError, match="--command"):
        docs.publish(str(tmp_path / "other.json"), root=str(tmp_path))
    # a message naming another run's folder beside the checkout (rows merged from two runs) is refused, not published
    elsewhere = os.path.join(os.path.dirname(ROOT), "bench_out2", "foreign", "m.tflite")
    (bench / "foreign.json").write_text(json.dumps({"section": "foreign", "run": {"date": "d"},
                                                    "rows": [{"error": f"{elsewhere}: does not fit"}]}))
    os.remove(results.path_of("custom", str(tmp_path)))
    with pytest.raises(UsageError, match="names a folder of this machine"):
        docs.publish(str(bench), root=str(tmp_path))
    # nothing of the folder published, the sound result beside it neither
    assert not any(os.path.exists(results.path_of(r, str(tmp_path))) for r in ("foreign", "custom"))


def test_run_record_names_the_command():
    rec = results.run_record([os.path.join(ROOT, "pipelines", "bench.py"), "--sections=custom"])
    assert rec["command"] == "python -m pipelines.bench --sections=custom"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", rec["date"]) and "cores" in rec["host"]


# ------------------------------------------------------------------------------------------ product, not history
HISTORY = [
    (re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
    (re.compile(r"\bthis session\b", re.I), "a session word"),
    (re.compile(r"\bcommits?\s+[0-9a-f]{7,40}\b"), "a commit"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"), "a commit hash"),
]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def _outside_markers(text: str) -> str:
    return docs.VALUE_RE.sub("", docs.TABLE_RE.sub("", text))


def test_pages_describe_the_product_not_its_history():
    found = []
    for page, text in PAGES.items():
        for n, line in enumerate(text.split("\n"), 1):
            for pattern, what in HISTORY:
                for m in pattern.finditer(line):
                    found.append(f"{page}:{n}: {what}: {m.group(0)!r}")
        for m in DATE.finditer(_outside_markers(text)):  # a date only as a result renders it
            found.append(f"{page}: a date outside a rendered result: {m.group(0)}")
    assert not found, "\n".join(found)


def test_history_patterns_find_what_they_should():
    text = "Since issue 23, commit 8a191f8 and in this session; TFLM 90b983c; 0xf32c9351, 1,665,168 B, deadbeef."
    hits = [m.group(0) for pattern, _ in HISTORY for m in pattern.finditer(text)]
    assert hits == ["issue 23", "this session", "commit 8a191f8", "8a191f8", "90b983c"], hits


# ------------------------------------------------------------------------------------------ pages and links
def test_docs_pages_exist():
    for page in ("getting-started", "pipelines", "custom-mode", "firmware", "memory", "halo", "search", "benchmarks",
                 "design", "testing", "limitations", "troubleshooting", "fit", "latency", "multistage"):
        assert f"docs/{page}.md" in PAGES, page


def test_readme_is_short():
    readme = PAGES["README.md"]
    lines = readme.count("\n") + (not readme.endswith("\n"))
    assert lines <= 200, lines
    first = "\n".join(readme.split("\n")[:60])
    assert "make demo" in first and "make test" in first
    assert all(f"python -m pipelines.{p} " in first for p in ("profile", "rewrite", "verify", "deploy")), first
    assert "TF_USE_LEGACY_KERAS=1" in readme and ".venv" in readme
    assert "docs/limitations.md" in readme and "docs/troubleshooting.md" in readme


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but '-' and '_' dropped, spaces -> '-'."""
    out = set()
    for title in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        out.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return out


def test_relative_links_resolve():
    """Every relative link of README and docs/*.md names an existing file, and its #anchor a heading there."""
    bad = []
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
                os.path.join(ROOT, page)
            if not os.path.isfile(full):
                bad.append(f"{page}: {target} (no such file)")
            elif anchor and full.endswith(".md") and anchor not in _anchors(open(full).read()):
                bad.append(f"{page}: {target} (no such heading)")
    assert not bad, bad


# ------------------------------------------------------------------------------------------ troubleshooting
def _error_classes() -> dict[str, str]:
    """Every exception class of tfmcu/ and pipelines/ that derives (through the project's own classes) from
    ``UsageError`` or ``TfmcuError``: the errors a user meets as one line."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for top in ("tfmcu", "pipelines"):
        for path in glob.glob(os.path.join(ROOT, top, "**", "*.py"), recursive=True):
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ClassDef):
                    names = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    bases[node.name] = (os.path.relpath(path, ROOT), names)

    def user_error(name: str, seen: frozenset = frozenset()) -> bool:
        if name in ("UsageError", "TfmcuError"):
            return True
        return name in bases and name not in seen and any(user_error(b, seen | {name}) for b in bases[name][1])

    return {name: where for name, (where, _) in bases.items() if user_error(name)}


def test_troubleshooting_names_every_error_class():
    classes = _error_classes()
    assert {"UsageError", "TfmcuError", "ScheduleError"} <= set(classes), sorted(classes)
    page = PAGES["docs/troubleshooting.md"]
    missing = [f"{name} ({where})" for name, where in sorted(classes.items()) if f"`{name}`" not in page]
    assert not missing, missing


# ------------------------------------------------------------------------------------------ README's tables
def _fit_row(model: str, what: str, arena: int | None, predicted: int, insns: int, macs: int,
             schedule: str | None = None, ratio: float | None = None) -> dict:
    return {"model": model, "target": "cortex-m4", "what": what, "schedule": schedule, "arena_used_bytes": arena,
            "predicted_arena_bytes": predicted, "arena_equal": arena == predicted if arena else None,
            "instructions": insns, "predicted_instructions": insns, "instructions_error": 0.0, "macs": macs,
            "flash_model_bytes": 1, "outputs_equal_tflite": arena is not None, "verdict": None,
            "arena_ratio": ratio, "instructions_ratio": 1.047}


def test_readme_tables_render_from_results_shaped_as_the_sections_write_them():
    """The story and the headline rows from results with the keys the bench sections write (a stand-in for the
    published results until they exist)."""
    fit = {"rows": [_fit_row("mbv2_035_144", "TFLM + CMSIS-NN per layer", None, 385348, 109152419, 100),
                    _fit_row("mbv2_035_144", "fit, max_latency 1.05", 59300, 59300, 114302715, 100, "9x9 over 5"),
                    _fit_row("mbv2_100_224", "TFLM + CMSIS-NN per layer", None, 1659716, 785467622, 300),
                    _fit_row("mbv2_100_224", "fit, max_latency 1.05", 218628, 218628, 802975387, 300, "8x8", 7.59)]}
    halo_fw = {"rows": [{"model": "mbv2_035_144", "variant": "cmsis_p", "target": "cortex-m4", "what": "4x4 n=5",
                         "invoke_insns": 141412243, "stage_insns": 1, "arena_used_bytes": 182676,
                         "arena_predicted": 182676, "macs": 100, "macs_executed": 120, "equal_tflite": True}]}
    plan = {"stages": 11, "describe": "11 stages: ...", "mac_overhead": 0.0, "macs": 100}
    one = {"stages": 1, "describe": "1 stage: ...", "mac_overhead": 0.0, "macs": 100}
    multistage = {"rows": [], "measured": {"mbv2_035_144": {"label": "x", "measured": [
        {**_fit_row("mbv2_035_144", "1 stage within 1.1x", 77812, 77812, 130672815, 100), "plan": one},
        {**_fit_row("mbv2_035_144", "smallest within 1.1x", 39716, 39716, 115682205, 100), "plan": plan}]}}}
    story = docs.story_table(fit, halo_fw, multistage)
    assert "| 385,348 (predicted: it does not link on the target) | 1.00x |" in story, story
    assert "| 59,300 | 6.50x | +0.0% | 1.047x | yes |" in story and "| 39,716 | 9.70x |" in story, story
    assert "fit's plan of one stage within 1.1x the instructions | 77,812 | 4.95x | +0.0% | 1.197x | yes |" in story, \
        story
    assert story.index("77,812") < story.index("39,716") < story.index("59,300"), story  # fit's choice last
    assert "| 182,676 | 2.11x | +20.0% | 1.296x | yes |" in story, story
    custom = {"rows": [{"model": "mbv2_100_224", "grid": [4, 4], "patch_blocks": 5, "rest_memory_plan": "inplace",
                        "tflm_original_bytes": 1665168, "measured_bytes": 473424, "ratio": 3.517, "bit_exact": True}]}
    claim = {"sram_bytes": 131072, "budget_bytes": 121456, "gain_points": 12.1,
             "per_layer": {"resolution": 48, "map50": 0.008}, "patched": {"resolution": 128, "map50": 0.129}}
    detection = {"rows": {"claims": [claim]}}
    search = {"rows": [{"budget_kb": 128, "search": "joint", "test_accuracy": 0.279, "resolution": 80},
                       {"budget_kb": 128, "search": "per_layer", "test_accuracy": 0.216, "resolution": 48}]}
    train = {"rows": [{"model": "mcunet-demo", "resolution": 96, "dataset": "fashion_mnist", "int8_tflm": 0.934,
                       "float": 0.9334, "tflite_equals_tflm": True}]}
    demo = {"model": "mcunet-demo", "resolution": 96, "mcu": {"target": "stm32f405", "schedule": "3x3", "images": 8,
                                                              "patched": {"run": {"arena_used_bytes": 92964,
                                                                                  "outputs_equal_tflite": True}}}}
    recipe = {"rows": {"setup": {"dataset": "shapes-det", "resolution": 96},
                       "runs": [{"run": "defaults", "map50_int8_tflm": 0.943, "training_seconds": 552.0}],
                       "hour": {"resolution": 128, "runs": [
                           {"run": "defaults", "map50_int8_tflm": 0.385, "with_classifier_seconds": 3015.3},
                           {"run": "lr 0.1", "map50_int8_tflm": 0.42, "with_classifier_seconds": 2935.5}]}}}
    head = docs.headline_table(custom, fit, detection, search, train, demo, recipe)
    for want in ("shapes-det @ 96 px, defaults: 94.3% after 9.2 min", "scenes-det @ 128 px: 42.0% after 48.9 min",
                 "1,665,168 -> 473,424 B (3.52x)", "218,628 B (7.59x below 1,659,716 B per layer) at 1.047x",
                 "128 kB: 48 px 0.8% vs 128 px 12.9% (+12.1 points)", "27.9% (80 px, patched) against 21.6%",
                 "int8 93.40% against float 93.34%", "92,964 B measured, top-1 = TF Lite on 8 images: yes"):
        assert want in head, (want, head)
