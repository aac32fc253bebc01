"""``tfmcu.abi`` against the C side, read as text (nothing is compiled): the enums, #defines and structs of the
kernel headers (``tflm_patch_kernels/*.h``), the rows of ``op_table.c`` and its layout checks, and what the TFLM
kernel (``tflm_patch_kernels/tflm/``) states of the custom options: op name, format versions, the keys it reads, the
row words of the tables it reads in place. A change on either side alone fails here; ``test_the_check_sees_*``
show that it does, on edited copies of the C text.
"""

from __future__ import annotations

import ctypes
import os
import re

import pytest

from tfmcu import abi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "tflm_patch_kernels")
TFLM = os.path.join(KERNELS, "tflm")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _read(folder: str, suffixes: tuple[str, ...]) -> dict[str, str]:
    if not os.path.isdir(folder):
        pytest.fail(f"{folder} is missing (the Bazel target needs the C sources as data)")
    return {f: _strip_comments(open(os.path.join(folder, f)).read()) for f in sorted(os.listdir(folder))
            if f.endswith(suffixes)}


def kernel_sources() -> dict[str, str]:
    """The kernel library's headers and op_table.c, comments removed."""
    files = _read(KERNELS, (".h", ".c"))
    backend = {f"cmsis_nn/{f}": t for f, t in _read(os.path.join(KERNELS, "cmsis_nn"), (".h",)).items()}
    return {**{f: t for f, t in files.items() if f.endswith(".h") or f == "op_table.c"}, **backend}


def tflm_sources() -> dict[str, str]:
    """The TFLM kernel's sources; the option parser is patch_stage_options.cc where it has its own file."""
    return _read(TFLM, (".h", ".cc"))


def option_parser(tflm: dict[str, str]) -> str:
    name = "patch_stage_options.cc" if "patch_stage_options.cc" in tflm else "patch_stage_op.cc"
    return tflm[name]


# ============================================================================= the C side, parsed
def _defines(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"#define\s+(\w+)\s+(-?\d+)\s*$", text, flags=re.M)}


def _enums(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for m in re.finditer(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        out[m[2]] = {e[1]: int(e[2]) for e in re.finditer(r"(\w+)\s*=\s*(-?\d+)", m[1])}
    return out


def _structs(text: str, defines: dict[str, int]) -> dict[str, tuple[tuple[str, str], ...]]:
    """typedef struct { ... } Name; -> ((field, C type), ...), "T*" for pointers, "T[n]" for arrays."""
    out = {}
    for m in re.finditer(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        fields = []
        for decl in m[1].split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            d = re.fullmatch(r"(.+?)\s*(\**)\s*(\w+)\s*(?:\[\s*(\w+)\s*\])?", decl)
            assert d, f"{m[2]}: cannot read '{decl}'"
            ctype = d[1] + d[2]
            if d[4]:
                ctype += f"[{defines.get(d[4], d[4])}]"
            fields.append((d[3], ctype))
        out[m[2]] = tuple(fields)
    return out


def _callbacks(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for m in re.finditer(r"typedef\s+(\w+)\s*\(\s*\*\s*(\w+)\s*\)\s*\((.*?)\)\s*;", text, flags=re.S):
        params = tuple(" ".join(re.sub(r"\w+\s*$", "", p).split()).replace(" *", "*")
                       for p in m[3].split(","))
        out[m[2]] = (m[1], params)
    return out


def _op_rows(op_table: str) -> dict[str, tuple[int, str, str, int, int]]:
    """[kTfmcuOpX] = {num_inputs, dtype, sizeof(Struct), num_arrays, num_words, ...}"""
    out = {}
    for m in re.finditer(r"\[\s*(kTfmcuOp\w+)\s*\]\s*=\s*\{([^{}]*)\}", op_table):
        cells = [c.strip() for c in m[2].split(",")]
        struct_name = re.fullmatch(r"sizeof\((\w+)\)", cells[2])
        assert struct_name, f"{m[1]}: params size is '{cells[2]}'"
        out[m[1]] = (int(cells[0]), cells[1], struct_name[1], int(cells[3]), int(cells[4]))
    return out


def _layouts(op_table: str) -> dict[str, tuple[int, str, str, int]]:
    """TFMCU_LAYOUT(Struct, arrays, first word, last word, words);"""
    return {m[1]: (int(m[2]), m[3], m[4], int(m[5])) for m in re.finditer(
        r"TFMCU_LAYOUT\(\s*(\w+)\s*,\s*(\d+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*\)\s*;", op_table)}


def _constants(text: str) -> dict[str, str]:
    """constexpr ... kName = value; / kName[] = value;"""
    return {m[1]: m[2].strip() for m in re.finditer(r"constexpr[^=;]*?\b(k\w+)\s*(?:\[\s*\w*\s*\])?\s*=\s*([^;]+);",
                                                     text)}


def _option_keys(parser: str) -> set[str]:
    """The map keys the parser reads: m["key"], MapInt(m, "key", ...)."""
    keys = set(re.findall(r"\w\s*\[\s*\"(\w+)\"\s*\]", parser))
    keys |= set(re.findall(r"MapInt\(\s*[\w.]+\s*,\s*\"(\w+)\"", parser))
    return keys


def c_side(kernels: dict[str, str], tflm: dict[str, str]) -> dict:
    headers = "\n".join(t for f, t in kernels.items() if f.endswith(".h"))
    defines = _defines(headers)
    tflm_all = "\n".join(tflm.values())
    constants = _constants(tflm_all)
    parser = option_parser(tflm)
    return {
        "defines": defines,
        "functions": set(re.findall(r"^\s*(?:const\s+)?\w+\s*\**\s*\b(\w+)\s*\(", headers, re.M)),
        "enums": _enums(headers),
        "structs": _structs(headers, defines),
        "callbacks": _callbacks(headers),
        "op_rows": _op_rows(kernels["op_table.c"]),
        "layouts": _layouts(kernels["op_table.c"]),
        "constants": constants,
        "option_keys": _option_keys(parser),
        "folded_rule": _macro(headers, "TFMCU_CONV1X1_FOLDED"),
        "depthwise3x3_rule": _macro(headers, "TFMCU_DEPTHWISE_CONV3X3_OURS"),
        "shallow_rule": _macro(headers, "TFMCU_CONV2D_SHALLOW_OURS"),
    }


def _macro(text: str, name: str) -> str | None:
    """The body of function-like macro ``name`` (continuation lines joined, whitespace collapsed)."""
    m = re.search(rf"#define\s+{name}\([^)]*\)((?:[^\n]*\\\n)*[^\n]*)", text)
    return None if m is None else " ".join(m[1].replace("\\\n", " ").split())


# ============================================================================= the comparison
def mismatches(c: dict) -> list[str]:
    """Where ``tfmcu.abi`` and the parsed C side differ (empty: they agree)."""
    out = []

    def check(what: str, c_value, py_value) -> None:
        if c_value != py_value:
            out.append(f"{what}: C {c_value!r} != tfmcu.abi {py_value!r}")

    d, enums = c["defines"], c["enums"]
    check("TFMCU_PATCH_STAGE_ABI_VERSION", d.get("TFMCU_PATCH_STAGE_ABI_VERSION"), abi.ABI_VERSION)
    check("TFMCU_MAX_LAYER_INPUTS", d.get("TFMCU_MAX_LAYER_INPUTS"), abi.MAX_LAYER_INPUTS)
    check("TFMCU_MAX_PARAM_ARRAYS", d.get("TFMCU_MAX_PARAM_ARRAYS"), abi.MAX_PARAM_ARRAYS)
    check("TFMCU_CONV1X1_FOLDED(pixels, in_channels)", c["folded_rule"], abi.CONV1X1_FOLDED_RULE)
    check("TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS", d.get("TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS"),
          abi.DEPTHWISE_CONV3X3_MAX_CHANNELS)
    check("TFMCU_DEPTHWISE_CONV3X3_OURS(p, channels)", c["depthwise3x3_rule"], abi.DEPTHWISE_CONV3X3_RULE)
    check("TFMCU_CONV2D_SHALLOW_MAX_DEPTH", d.get("TFMCU_CONV2D_SHALLOW_MAX_DEPTH"), abi.CONV2D_SHALLOW_MAX_DEPTH)
    check("TFMCU_CONV2D_SHALLOW_MAX_OUT", d.get("TFMCU_CONV2D_SHALLOW_MAX_OUT"), abi.CONV2D_SHALLOW_MAX_OUT)
    check("TFMCU_CONV2D_SHALLOW_OURS(p, in_channels, out_channels)", c["shallow_rule"], abi.CONV2D_SHALLOW_RULE)
    check("TFMCU_LUT_MIN_ELEMENTS", d.get("TFMCU_LUT_MIN_ELEMENTS"), abi.LUT_MIN_ELEMENTS)
    check("TFMCU_LUT_MAX_CHANNELS", d.get("TFMCU_LUT_MAX_CHANNELS"), abi.LUT_MAX_CHANNELS)
    check(f"function {abi.CONV1X1_FOLDED_SYMBOL} declared", abi.CONV1X1_FOLDED_SYMBOL in c["functions"], True)
    check("TfmcuStatus", enums.get("TfmcuStatus"), {name: value for name, value, _ in abi.STATUSES})
    check("TfmcuDataType", enums.get("TfmcuDataType"), dict(abi.DATA_TYPES))
    check("TfmcuOpType", enums.get("TfmcuOpType"), {op.enumerator: code for code, op in abi.OPS.items()})
    for name, fields in abi.STRUCTS.items():
        check(f"struct {name}", c["structs"].get(name), fields)
    for name, (ret, params) in abi.CALLBACKS.items():
        check(f"callback {name}", c["callbacks"].get(name), (ret, params))
    dtype = {value: name for name, value in abi.DATA_TYPES}
    check("op_table.c rows", c["op_rows"], {
        op.enumerator: (op.num_inputs, dtype[op.input_dtype], op.c_struct, len(op.arrays), len(op.words))
        for op in abi.OPS.values()})
    check("op_table.c TFMCU_LAYOUT", c["layouts"], {
        op.c_struct: (len(op.arrays), op.words[0][0], op.words[-1][0], len(op.words)) for op in abi.OPS.values()})
    k = c["constants"]
    check("kPatchStageOpName", k.get("kPatchStageOpName"), f'"{abi.PATCH_STAGE_OP}"')
    check("kPatchStageFormatVersion", k.get("kPatchStageFormatVersion"), str(abi.FORMAT_VERSION))
    check("kPatchStageOldestFormatVersion", k.get("kPatchStageOldestFormatVersion"), str(abi.OLDEST_FORMAT_VERSION))
    check("kPatchStageBlobInput", k.get("kPatchStageBlobInput"), str(abi.BLOB_INPUT))
    check("option keys", c["option_keys"], set(abi.OPTION_KEYS))
    return out


# ============================================================================= tests
def test_abi_matches_the_c_sources():
    problems = mismatches(c_side(kernel_sources(), tflm_sources()))
    assert not problems, "\n".join(problems)


def _edited(file: str, old: str, new: str, tflm: bool = False) -> list[str]:
    kernels, tflm_files = kernel_sources(), tflm_sources()
    files = tflm_files if tflm else kernels
    if file == "<parser>":
        file = "patch_stage_options.cc" if "patch_stage_options.cc" in files else "patch_stage_op.cc"
    if file == "<format>":
        file = next(f for f, t in files.items() if re.search(r"\bkPatchStageFormatVersion\s*=", t))
    assert old in files[file], (file, old)
    files[file] = files[file].replace(old, new, 1)
    return mismatches(c_side(kernels, tflm_files))


@pytest.mark.parametrize("file, old, new, tflm, what", [
    ("op_table.h", "kTfmcuOpAdd = 3", "kTfmcuOpAdd = 9", False, "TfmcuOpType"),
    ("tfmcu_common.h", "kTfmcuErrorEmptyWindow = 6", "kTfmcuErrorEmptyWindow = 7", False, "TfmcuStatus"),
    ("conv2d.h", "int32_t groups;", "int32_t groups;\n  int32_t extra;", False, "struct TfmcuConvParams"),
    ("quantize.h", "float scale;", "int32_t scale;", False, "struct TfmcuQuantizeParams"),
    ("patch_stage_types.h", "uint32_t scratch_bytes;", "int32_t scratch_bytes;", False, "struct TfmcuStage"),
    ("patch_stage.h", "#define TFMCU_PATCH_STAGE_ABI_VERSION 8", "#define TFMCU_PATCH_STAGE_ABI_VERSION 9", False,
     "TFMCU_PATCH_STAGE_ABI_VERSION"),
    ("op_table.c", "sizeof(TfmcuPadParams), 0, 1,", "sizeof(TfmcuPadParams), 0, 2,", False, "op_table.c rows"),
    ("<format>", "kPatchStageFormatVersion = 5", "kPatchStageFormatVersion = 6", True, "kPatchStageFormatVersion"),
    ("<parser>", '"streamed_input"', '"streamed"', True, "option keys"),
    ("<format>", "kPatchStageBlobInput = 1", "kPatchStageBlobInput = 2", True, "kPatchStageBlobInput"),
    ("patch_stage_types.h", "int32_t constants;", "int32_t constants;\n  int32_t extra;", False, "struct TfmcuStageBlob"),
    ("cmsis_nn/cmsis_nn_backend.h", "void tfmcu_conv1x1_folded_s8(", "void tfmcu_conv1x1_product_s8(", False,
     "function tfmcu_conv1x1_folded_s8"),
    ("cmsis_nn/cmsis_nn_backend.h", "((pixels) > 1)", "((pixels) > 2)", False,
     "TFMCU_CONV1X1_FOLDED(pixels, in_channels)"),
    ("cmsis_nn/cmsis_nn_backend.h", "#define TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS 128",
     "#define TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS 96", False, "TFMCU_DEPTHWISE_CONV3X3_MAX_CHANNELS"),
    ("conv2d.h", "#define TFMCU_CONV2D_SHALLOW_MAX_DEPTH 32", "#define TFMCU_CONV2D_SHALLOW_MAX_DEPTH 36", False,
     "TFMCU_CONV2D_SHALLOW_MAX_DEPTH"),
])
def test_the_check_sees_a_change_of_the_c_side_alone(file, old, new, tflm, what):
    problems = _edited(file, old, new, tflm)
    assert problems and all(p.startswith(what) for p in problems), problems


def test_the_check_sees_a_change_of_the_python_side_alone(monkeypatch):
    c = c_side(kernel_sources(), tflm_sources())
    monkeypatch.setitem(abi.STRUCTS, "TfmcuCache", abi.STRUCTS["TfmcuCache"][::-1])
    monkeypatch.setattr(abi, "FORMAT_VERSION", 6)
    monkeypatch.setitem(abi.OPTION_KEYS, "halo", 3)
    problems = mismatches(c)
    assert [p.split(":")[0] for p in problems] == ["struct TfmcuCache", "kPatchStageFormatVersion", "option keys"]


# ---------------------------------------------------------------------------- the derived views
def test_ctypes_mirrors_and_c_sizes_agree():
    """``structure`` (ctypes, this host) and ``sizeof(.., 8)`` compute the same layout; 32-bit sizes of the structs
    the TFLM kernel allocates, as arm-none-eabi lays them out (4-byte pointers)."""
    if ctypes.sizeof(ctypes.c_void_p) == 8:
        for name in abi.STRUCTS:
            assert ctypes.sizeof(abi.structure(name)) == abi.sizeof(name, 8), name
    assert [abi.sizeof(n, 4) for n in ("TfmcuStage", "TfmcuPreparedStage", "TfmcuLayer", "TfmcuTensor",
                                       "TfmcuConvParams", "TfmcuQuantizeParams", "TfmcuPatchStageOpData",
                                       "TfmcuStageBlob")] == [84, 36, 32, 24, 60, 8, 48, 88]
    assert abi.sizeof("TfmcuStage", 8) == 152 and abi.sizeof("TfmcuPatchStageOpData", 8) == 56


def test_table_rows_and_op_words():
    assert abi.word_offsets("TfmcuSpan") == {"out_start": 0, "out_stop": 1, "in_start": 2, "in_stop": 4,
                                             "pad_before": 6, "pad_after": 8}
    assert (abi.SPAN_WORDS, abi.TENSOR_WORDS, abi.CACHE_WORDS) == (10, 6, 3)
    assert abi.ARRAY_NAMES == abi.OPS[abi.OP_CONV].arrays == abi.OPS[abi.OP_DEPTHWISE].arrays
    conv = dict(kernel_h=3, kernel_w=1, stride_h=2, stride_w=1, dilation_h=1, dilation_w=2, groups=1, input_offset=5,
                output_offset=-3, act_min=-128, act_max=127)
    assert abi.params_to_words(abi.OP_CONV, conv) == [3, 1, 2, 1, 1, 2, 1, 5, -3, -128, 127]
    assert abi.params_from_words(abi.OP_CONV, abi.params_to_words(abi.OP_CONV, conv)) == conv
    q = abi.params_to_words(abi.OP_QUANTIZE, dict(scale=0.5, zero_point=-1))
    assert q == [0x3F000000, -1] and abi.params_from_words(abi.OP_QUANTIZE, q) == dict(scale=0.5, zero_point=-1)
    with pytest.raises(ValueError, match="11 scalar params"):
        abi.params_from_words(abi.OP_CONV, [1, 2])
    with pytest.raises(ValueError, match="unknown C kernel op type 15"):
        abi.op(15)
