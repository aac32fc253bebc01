"""The Bazel build graph of a `deploy` firmware folder, read without Bazel (``tfmcu.firmware.tree`` exports it):
the folder's BUILD and every BUILD file its dependencies name (tflm_patch_kernels/**/BUILD; the third_party/*.BUILD
files WORKSPACE gives the pinned upstream archives, globbed over the archives' contents) evaluated as the Python subset
of Starlark they are written in (unknown rules and functions are recorded or ignored), the archives read at export
time from Bazel's --distdir (``.bazel_local/repos.bazelrc``), ``$TFMCU_THIRD_PARTY`` or ``../shared/third_party``
(each checked against its sha256) with the patches WORKSPACE applies, and the arm-none-eabi toolchain's flags for a
platform (tools/bazel/arm/cc_toolchain_config.bzl, evaluated for its core).

``BazelGraph(folder).libraries()``: the firmware's cc_binary and every cc_library it links, in link order
(``Library``: sources, copts, defines, include paths); ``toolchain_flags(platform)``; ``included_headers``: the
headers their sources include, followed through the include paths.
"""

from __future__ import annotations

import ast
import builtins
import functools
import gzip
import hashlib
import inspect
import io
import os
import re
import shlex
import tarfile
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from tfmcu.errors import TfmcuError
from tfmcu.firmware.sources import REPO, ROOT
MAIN = ""  # the main repository in labels (@//pkg:name)
TREE_DIRS = {MAIN: "tfmcu", REPO: "app", "tflite_micro": "tflite-micro"}  # others: third_party/<name>
BINARY = "firmware_bin"  # the folder's cc_binary (tfmcu/firmware/sources.py build_file)
MODEL_LIBRARY = f"@{REPO}//:model"  # the folder's model library (tfmcu_model.h)
# Bazel's reproducibility flags (paths, dates): nothing a plain build needs.
BAZEL_ONLY_FLAGS = ("-no-canonical-prefixes", "-fno-canonical-system-headers", "-Wno-builtin-macro-redefined",
                     "-D__DATE__", "-D__TIMESTAMP__", "-D__TIME__")


class TreeError(TfmcuError):
    """The tree cannot be exported (an archive missing, a BUILD file the exporter cannot follow); one line."""


# ---- BUILD files as Python ------------------------------------------------------------------------------------------

class _Anything:
    """What a BUILD file names that the tree needs nothing of; called with ``name=``, it records a rule."""

    def __init__(self, kind: str = "", rules: dict | None = None):
        self._kind, self._rules = kind, rules

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        if self._rules is not None and isinstance(kwargs.get("name"), str):
            self._rules[kwargs["name"]] = (self._kind, kwargs)
        return _Anything()

    def __getattr__(self, name: str) -> "_Anything":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, self._rules)

    def __getitem__(self, key: Any) -> "_Anything":
        return _Anything()

    def __iter__(self):
        return iter(())

    def keys(self) -> list:
        return []


def _glob_regex(pattern: str) -> re.Pattern:
    parts = pattern.split("/")
    out = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out += ".*" if last else "(?:[^/]+/)*"
        else:
            out += re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + ("" if last else "/")
    return re.compile(out + r"\Z")


def glob_files(files: list[str], include: list[str], exclude: list[str] = ()) -> list[str]:
    """Bazel's glob over ``files`` (paths relative to the package): ``*`` within a folder, ``**`` any folders."""
    inc = [_glob_regex(p) for p in include]
    exc = [_glob_regex(p) for p in exclude]
    return sorted(f for f in files if any(r.match(f) for r in inc) and not any(r.match(f) for r in exc))


def _exec_starlark(text: str, where: str, env: dict[str, Any], rules: dict) -> dict[str, Any]:
    """Runs a BUILD / .bzl / WORKSPACE file; every free name not in ``env`` is an ``_Anything`` recording rules."""
    try:
        tree = ast.parse(text, where)
    except SyntaxError as e:
        raise TreeError(f"{where}: cannot be read as Starlark ({e.msg}, line {e.lineno})") from None
    g: dict[str, Any] = {"__builtins__": builtins}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not hasattr(builtins, node.id):
            g[node.id] = _Anything(node.id, rules)
    g.update(env)
    exec(compile(tree, where, "exec"), g)  # noqa: S102 - this repository's own BUILD files
    return g


def _fail(*args: Any, **kwargs: Any) -> None:
    raise TreeError("a BUILD file failed: " + " ".join(str(a) for a in args))


# ---- repositories: the checkout, the deploy folder, the pinned archives --------------------------------------------

class Repo:
    name: str
    tree: str  # its folder in the tree

    def has(self, path: str) -> bool:
        raise NotImplementedError

    def read(self, path: str) -> bytes:
        raise NotImplementedError

    def listing(self, pkg: str) -> list[str]:
        """The package's files, relative to it (not those of subpackages)."""
        raise NotImplementedError


class DirRepo(Repo):
    def __init__(self, name: str, root: str):
        self.name, self.root, self.tree = name, root, TREE_DIRS[name]

    def has(self, path: str) -> bool:
        return os.path.isfile(os.path.join(self.root, path))

    def read(self, path: str) -> bytes:
        with open(os.path.join(self.root, path), "rb") as f:
            return f.read()

    def listing(self, pkg: str) -> list[str]:
        base = os.path.join(self.root, pkg)
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, base)
            if rel != "." and any(os.path.exists(os.path.join(dirpath, b)) for b in ("BUILD", "BUILD.bazel")):
                dirnames[:] = []
                continue
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-"))]
            out += [f if rel == "." else f"{rel}/{f}" for f in filenames]
        return out


class ArchiveRepo(Repo):
    """An http_archive of WORKSPACE, read from its pinned archive (strip_prefix applied, patches applied)."""

    def __init__(self, name: str, path: str, strip_prefix: str):
        self.name, self.path = name, path
        self.tree = TREE_DIRS.get(name, f"third_party/{name}")
        with gzip.open(path) if path.endswith(("gz", "tgz")) else open(path, "rb") as f:
            raw = f.read()  # in memory: random access without decompressing the stream again per file
        self._tar = tarfile.open(fileobj=io.BytesIO(raw))
        prefix = strip_prefix.rstrip("/") + "/" if strip_prefix else ""
        self._members = {m.name[len(prefix):]: m for m in self._tar.getmembers()
                         if m.isfile() and m.name.startswith(prefix)}
        self._patched: dict[str, bytes] = {}

    def has(self, path: str) -> bool:
        return path in self._members

    def read(self, path: str) -> bytes:
        if path in self._patched:
            return self._patched[path]
        return self._tar.extractfile(self._members[path]).read()

    def listing(self, pkg: str) -> list[str]:
        assert pkg == ""  # upstream BUILD files below the top are dropped (WORKSPACE patch_cmds): one package
        return list(self._members)

    def apply_patch(self, diff: str, strip: int, where: str) -> None:
        for path, hunks in _parse_diff(diff, strip, where):
            lines = self.read(path).decode().split("\n")
            self._patched[path] = "\n".join(_apply_hunks(lines, hunks, f"{where}: {path}")).encode()


def _parse_diff(diff: str, strip: int, where: str) -> list[tuple[str, list]]:
    """A unified diff: [(path, [(old_start, [(' ' | '-' | '+', line), ...]), ...])]."""
    files: list[tuple[str, list]] = []
    lines = diff.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("+++ "):
            path = lines[i][4:].split("\t")[0].strip()
            files.append(("/".join(path.split("/")[strip:]), []))
        elif lines[i].startswith("@@ ") and files:
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", lines[i])
            if not m:
                raise TreeError(f"{where}: malformed hunk header {lines[i]!r}")
            old_n = int(m.group(2) or 1)
            new_n = int(m.group(4) or 1)
            body = []
            while old_n > 0 or new_n > 0:
                i += 1
                line = lines[i]
                tag, text = (line[:1] or " "), line[1:]
                if tag == "\\":
                    continue
                body.append((tag, text))
                old_n -= tag in " -"
                new_n -= tag in " +"
            files[-1][1].append((int(m.group(1)), body))
        i += 1
    return files


def _apply_hunks(lines: list[str], hunks: list, where: str) -> list[str]:
    out: list[str] = []
    pos = 0
    for start, body in hunks:
        old = [t for tag, t in body if tag in " -"]
        at = start - 1 if old else start
        for delta in (0, *[d for k in range(1, 50) for d in (k, -k)]):  # patch's fuzz-free offset search
            s = at + delta
            if s >= pos and lines[s:s + len(old)] == old:
                break
        else:
            raise TreeError(f"{where}: a hunk at line {start} does not apply")
        out += lines[pos:s]
        out += [t for tag, t in body if tag in " +"]
        pos = s + len(old)
    return out + lines[pos:]


def _checkouts() -> list[str]:
    """This checkout, and the one its files link to (under `bazel test`, ROOT is a runfiles tree of links)."""
    real = os.path.dirname(os.path.realpath(os.path.join(ROOT, "WORKSPACE")))
    return [ROOT] + ([real] if real != ROOT else [])


def archive_dirs(third_party: str | None = None) -> list[str]:
    """Where the pinned archives are looked for, in order: ``third_party``, $TFMCU_THIRD_PARTY, Bazel's --distdir
    (.bazel_local/repos.bazelrc, user.bazelrc), ../shared/third_party beside the checkout."""
    dirs = [d for d in (third_party, os.environ.get("TFMCU_THIRD_PARTY")) if d]
    for root in _checkouts():
        for rc in (os.path.join(root, ".bazel_local", "repos.bazelrc"), os.path.join(root, "user.bazelrc")):
            if os.path.isfile(rc):
                with open(rc) as f:
                    dirs += re.findall(r"--distdir=(\S+)", f.read())
    dirs += [os.path.normpath(os.path.join(root, "..", "shared", "third_party")) for root in _checkouts()]
    return list(dict.fromkeys(dirs))


def workspace_archives() -> dict[str, dict]:
    """WORKSPACE's http_archive declarations: {name: their arguments (urls, sha256, strip_prefix, patches, ...)}."""
    rules: dict[str, tuple] = {}
    with open(os.path.join(ROOT, "WORKSPACE")) as f:
        _exec_starlark(f.read(), "WORKSPACE", {"load": lambda *a, **k: None}, rules)
    return {name: kw for name, (kind, kw) in rules.items() if kind == "http_archive"}


@functools.lru_cache(maxsize=None)
def _checked(path: str, mtime: float, sha256: str) -> bool:
    return _sha256(path) == sha256


def find_archive(name: str, decl: dict, third_party: str | None = None) -> str:
    """The pinned archive of WORKSPACE's http_archive ``name`` (``decl``: its arguments): the file named as its URL's
    last part in ``archive_dirs(third_party)``, with the sha256 WORKSPACE pins; a one-line ``TreeError`` otherwise."""
    url = decl["urls"][0]
    base = url.rsplit("/", 1)[-1]
    dirs = archive_dirs(third_party)
    path = next((os.path.join(d, base) for d in dirs if os.path.isfile(os.path.join(d, base))), None)
    if path is None:
        raise TreeError(f"@{name}: archive {base} ({url}) not found in {', '.join(dirs)}; "
                        f"set TFMCU_THIRD_PARTY to the folder that holds it")
    if not _checked(path, os.path.getmtime(path), decl["sha256"]):
        raise TreeError(f"@{name}: {path} is not the archive WORKSPACE pins (sha256 {decl['sha256']})")
    return path


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- the build graph ------------------------------------------------------------------------------------------------

@dataclass
class Library:
    """One cc_library (or the cc_binary) the firmware links, as the tree builds it. Paths are the tree's."""
    label: str
    srcs: list[str] = field(default_factory=list)  # .c / .cc compiled
    hdrs: list[str] = field(default_factory=list)  # headers it declares (srcs' and hdrs')
    copts: list[str] = field(default_factory=list)
    local_defines: list[str] = field(default_factory=list)  # its own
    defines: list[str] = field(default_factory=list)  # its own and its dependencies' (Bazel propagates them)
    quote_dirs: list[str] = field(default_factory=list)  # repository roots (Bazel's -iquote)
    system_dirs: list[str] = field(default_factory=list)  # `includes` of it and its dependencies (-isystem)
    deps: list[str] = field(default_factory=list)
    alwayslink: bool = False
    linkopts: list[str] = field(default_factory=list)
    link_inputs: list[str] = field(default_factory=list)
    pch: tuple[str, tuple[str, ...]] | None = None  # a cc_pch dependency: (its label, the headers it precompiles)

    @property
    def cmake_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.label.lstrip("@/:")).strip("_")


class BazelGraph:
    """The Bazel packages the firmware's dependencies name, evaluated on demand."""

    def __init__(self, folder: str, third_party: str | None):
        self.repos: dict[str, Repo] = {MAIN: DirRepo(MAIN, ROOT), REPO: DirRepo(REPO, os.path.abspath(folder))}
        self._packages: dict[tuple[str, str], dict] = {}
        self._bzl: dict[str, dict] = {}
        self.archives: dict[str, dict] = {}
        self._third_party = third_party
        self._workspace = workspace_archives()

    def close(self) -> None:
        for r in self.repos.values():
            if isinstance(r, ArchiveRepo):
                r._tar.close()

    # -- labels --
    @staticmethod
    def parse(label: str, repo: str, pkg: str) -> tuple[str, str, str]:
        """(repository, package, name) of ``label`` written in ``repo``'s package ``pkg``."""
        if label.startswith("@"):
            name, sep, rest = label[1:].partition("//")
            if not sep:  # "@cmsis_nn" is "@cmsis_nn//:cmsis_nn"
                return name, "", name
            repo, label = name, "//" + rest
        if label.startswith("//"):
            p, _, n = label[2:].partition(":")
            return repo, p, n or p.rsplit("/", 1)[-1]
        if label.startswith(":"):
            return repo, pkg, label[1:]
        return repo, pkg, label

    def repo(self, name: str) -> Repo:
        if name not in self.repos:
            self.repos[name] = self._open_archive(name)
        return self.repos[name]

    def tree_path(self, repo: str, path: str) -> str:
        return os.path.normpath(os.path.join(self.repo(repo).tree, path)).replace(os.sep, "/")

    # -- the archives --
    def _open_archive(self, name: str) -> ArchiveRepo:
        decl = self._workspace.get(name)
        if decl is None:
            raise TreeError(f"@{name}: not an http_archive of WORKSPACE")
        url = decl["urls"][0]
        path = find_archive(name, decl, self._third_party)
        repo = ArchiveRepo(name, path, decl.get("strip_prefix", ""))
        self.repos[name] = repo
        strip = next((int(a[2:]) for a in decl.get("patch_args", []) if a.startswith("-p")), 0)
        for patch in decl.get("patches", []):
            r, p, n = self.parse(patch, name, "")
            repo.apply_patch(self.repo(r).read(os.path.join(p, n)).decode(), strip, patch)
        self.archives[name] = {"url": url, "sha256": decl["sha256"], "archive": path,
                               "patches": list(decl.get("patches", []))}
        return repo

    # -- packages --
    def build_text(self, repo: str, pkg: str) -> tuple[str, str]:
        if repo in (MAIN, REPO):
            r = self.repos[repo]
            for b in ("BUILD", "BUILD.bazel"):
                if r.has(os.path.join(pkg, b)):
                    return r.read(os.path.join(pkg, b)).decode(), f"@{repo}//{pkg}:{b}"
            raise TreeError(f"@{repo}//{pkg}: no BUILD file")
        decl = self._workspace.get(repo) or {}
        if "build_file" not in decl or pkg:
            raise TreeError(f"@{repo}//{pkg}: WORKSPACE gives it no build_file")
        r, p, n = self.parse(decl["build_file"], MAIN, "")
        return self.repo(r).read(os.path.join(p, n)).decode(), decl["build_file"]

    def package(self, repo: str, pkg: str) -> dict:
        key = (repo, pkg)
        if key not in self._packages:
            text, where = self.build_text(repo, pkg)
            rules: dict[str, tuple] = {}
            r = self.repo(repo)
            listing = r.listing(pkg)

            def glob(include: list[str], exclude: list[str] = (), **_: Any) -> list[str]:
                return glob_files(listing, include, exclude)

            env = {"glob": glob, "load": self._loader(repo, pkg, rules), "struct": types.SimpleNamespace,
                   "fail": _fail, "package": lambda **_: None, "cc_library": _Anything("cc_library", rules),
                   "cc_binary": _Anything("cc_binary", rules)}
            _exec_starlark(text, where, env, rules)
            self._packages[key] = rules
        return self._packages[key]

    def _loader(self, repo: str, pkg: str, rules: dict, fixed: Any = ()) -> Callable[..., None]:
        """load(): the symbols of a .bzl file into the caller's globals, except ``fixed`` ones (given by the
        exporter)."""
        def load(label: str, *symbols: str, **aliases: str) -> None:
            frame_globals = _caller_globals()
            values = self.bzl(label, repo, pkg)
            for local, sym in [(s, s) for s in symbols] + list(aliases.items()):
                if local in fixed:
                    continue
                v = values.get(sym)
                # rules and macros record what they are called with; constants (TARGETS, MPS2) keep their value
                frame_globals[local] = (_Anything(sym, rules) if v is None or callable(v) else v)
        return load

    def bzl(self, label: str, repo: str, pkg: str, env: dict | None = None) -> dict[str, Any]:
        """A .bzl file's globals (an external one, e.g. @bazel_tools, is empty)."""
        r, p, n = self.parse(label, repo, pkg)
        if r not in (MAIN, REPO):
            return {}
        path = os.path.join(p, n)
        key = f"{r}:{path}:{id(env) if env else ''}"
        if key not in self._bzl:
            base = {"load": self._loader(r, p, {}, fixed=set(env or ())), "struct": types.SimpleNamespace,
                    "fail": _fail}
            base.update(env or {})
            text = self.repo(r).read(path).decode()
            self._bzl[key] = _exec_starlark(text, f"@{r}//{p}:{n}", base, {})
        return self._bzl[key]

    def rule(self, label: str, repo: str, pkg: str) -> tuple[str, str, str, str, dict] | None:
        r, p, n = self.parse(label, repo, pkg)
        rules = self.package(r, p)
        if n not in rules:
            return None
        kind, kw = rules[n]
        return r, p, n, kind, kw

    def files(self, items: list[str], repo: str, pkg: str) -> list[tuple[str, str]]:
        """Source files named by srcs / hdrs entries (files or filegroups), as (repository, path)."""
        out = []
        for item in items:
            found = self.rule(item, repo, pkg) if (item.startswith((":", "//", "@")) or
                                                  "/" not in item and "." not in item) else None
            if found:
                r, p, _, kind, kw = found
                if kind != "filegroup":
                    raise TreeError(f"{item}: a {kind} in srcs; the tree takes files and filegroups only")
                out += self.files(list(kw.get("srcs", [])), r, p)
            else:
                r, p, n = self.parse(item, repo, pkg)
                out.append((r, os.path.join(p, n) if p else n))
        return out

    def libraries(self) -> tuple[list[Library], dict]:
        """The firmware's cc_binary and every cc_library it links, in link order (dependents first), and the folder's
        mcu_binary (its platform)."""
        rules = self.package(REPO, "")
        mcu = next((kw for kind, kw in rules.values() if kind == "mcu_binary"), None)
        if BINARY not in rules or mcu is None:
            raise TreeError(f"the folder's BUILD has no cc_binary {BINARY!r} and mcu_binary (not a deploy folder?)")
        done: dict[str, Library] = {}
        pchs: dict[str, tuple[str, tuple[str, ...]]] = {}  # cc_pch rules: (the -include name, the headers)
        post: list[str] = []

        def visit(label: str, repo: str, pkg: str) -> str:
            found = self.rule(label, repo, pkg)
            if found is None:
                raise TreeError(f"{label} (named in @{repo}//{pkg}): no such rule")
            r, p, n, kind, kw = found
            key = f"@{r}//{p}:{n}"
            if key in done or key in pchs:
                return key
            if kind == "cc_pch":  # tools/bazel/pch.bzl: CMake precompiles the same headers (cmake_lists)
                pchs[key] = (kw["header"], tuple(kw["includes"]))
                return key
            if kind not in ("cc_library", "cc_binary"):
                raise TreeError(f"{key}: a {kind}; the tree follows cc_library dependencies only")
            lib = Library(key)
            done[key] = lib
            lib.deps = [d for d in (visit(d, r, p) for d in kw.get("deps", [])) if d in done]
            for rr, path in self.files(list(kw.get("srcs", [])), r, p):
                (lib.srcs if path.endswith((".c", ".cc", ".cpp", ".S")) else lib.hdrs).append(self.tree_path(rr, path))
            lib.hdrs += [self.tree_path(rr, path) for rr, path in self.files(list(kw.get("hdrs", [])), r, p)]
            lib.copts = [t for c in kw.get("copts", []) for t in shlex.split(c)]
            for pch, (header, includes) in pchs.items():  # `-include <header>`: CMake's own precompiled header
                at = [i for i, t in enumerate(lib.copts) if t == "-include" and lib.copts[i + 1:i + 2] == [header]]
                if at:
                    lib.pch = (pch, includes)
                    lib.copts = lib.copts[:at[0]] + lib.copts[at[0] + 2:]
            lib.local_defines = [t for d in kw.get("local_defines", []) for t in shlex.split(d)]
            own_defines = [t for d in kw.get("defines", []) for t in shlex.split(d)]
            own_system = [self.tree_path(r, os.path.join(p, i)) for i in kw.get("includes", [])]
            lib.defines = unique(own_defines + [d for dep in lib.deps for d in done[dep].defines])
            lib.system_dirs = unique(own_system + [s for dep in lib.deps for s in done[dep].system_dirs])
            lib.quote_dirs = unique([self.repo(r).tree] + [q for dep in lib.deps for q in done[dep].quote_dirs])
            lib.alwayslink = bool(kw.get("alwayslink", False))
            lib.link_inputs = [self.tree_path(rr, path)
                               for rr, path in self.files(list(kw.get("additional_linker_inputs", [])), r, p)]

            def location(m: re.Match) -> str:
                rr, pp, nn = self.parse(m.group(1), r, p)
                return "${CMAKE_CURRENT_SOURCE_DIR}/" + self.tree_path(rr, os.path.join(pp, nn))
            opts = [re.sub(r"\$\(location ([^)]+)\)", location, o) for o in kw.get("linkopts", [])]
            # "-T", "script" as one option: CMake de-duplicates link options one by one
            lib.linkopts = [o + opts[i + 1] if o == "-T" and i + 1 < len(opts) else o
                            for i, o in enumerate(opts) if i == 0 or opts[i - 1] != "-T"]
            post.append(key)
            return key

        visit(":" + BINARY, REPO, "")
        order = list(reversed(post))  # dependents before their dependencies, the binary first
        return [done[k] for k in order], mcu

    # -- the toolchain --
    def toolchain_flags(self, platform: str) -> dict[str, list[str]]:
        """The compile / link flags of the arm-none-eabi toolchain Bazel resolves for ``platform`` (the folder's
        mcu_binary), and .bazelrc's --conlyopt / --cxxopt: {"cpu", "compile", "c", "cxx", "link", "libs"}."""
        found = self.rule(platform, MAIN, "")
        if found is None or found[3] != "platform":
            raise TreeError(f"{platform}: not a platform")
        r, p, _, _, kw = found
        wanted = {self.parse(c, r, p) for c in kw.get("constraint_values", [])}
        rules = self.package(r, p)
        chain = None
        for kind, tkw in rules.values():
            if kind == "toolchain" and {self.parse(c, r, p) for c in tkw.get("target_compatible_with", [])} <= wanted:
                chain = tkw
                break
        if chain is None:
            raise TreeError(f"{platform}: no toolchain in @{r}//{p} matches it")
        cc = self.rule(chain["toolchain"], r, p)[4]
        cfg_r, cfg_p, _, cfg_kind, cfg = self.rule(cc["toolchain_config"], r, p)
        bzl_label = next(label for label, syms in self._loads(cfg_r, cfg_p) if cfg_kind in syms)

        def record(**kw: Any) -> dict:
            return kw
        env = {"feature": record, "flag_set": record, "flag_group": record, "tool_path": record,
               "ACTION_NAMES": _Names(), "cc_common": types.SimpleNamespace(create_cc_toolchain_config_info=record)}
        values = self.bzl(bzl_label, cfg_r, cfg_p, env)
        config = values["_impl"](types.SimpleNamespace(attr=types.SimpleNamespace(core=cfg["core"])))
        flags: dict[str, list[str]] = {"cpu": list(values["CPU_FLAGS"][cfg["core"]]), "compile": [], "c": [],
                                       "cxx": [], "link": [], "libs": []}
        for feature in config["features"]:
            if not feature.get("enabled"):
                continue
            for fs in feature.get("flag_sets", []):
                actions = set(fs["actions"])
                fl = [f for g in fs["flag_groups"] for f in g["flags"]]
                if "cpp_link_executable" in actions:
                    flags["libs" if feature["name"].endswith("_libs") else "link"] += fl
                elif {"c_compile", "cpp_compile"} <= actions:
                    flags["compile"] += fl
                elif "c_compile" in actions:
                    flags["c"] += fl
                elif "cpp_compile" in actions:
                    flags["cxx"] += fl
        cpu = flags["cpu"]
        for k in ("compile", "link"):  # the CPU flags come first in both; keep them apart
            if flags[k][:len(cpu)] == cpu:
                flags[k] = flags[k][len(cpu):]
            flags[k] = [f for f in flags[k] if not f.startswith(BAZEL_ONLY_FLAGS)]
        rc = self._bazelrc_opts()
        flags["c"] = rc.get("conlyopt", []) + rc.get("copt", []) + flags["c"]
        flags["cxx"] = rc.get("cxxopt", []) + rc.get("copt", []) + flags["cxx"]
        return flags

    def _loads(self, repo: str, pkg: str) -> list[tuple[str, set[str]]]:
        text, _ = self.build_text(repo, pkg)
        out = []
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "load" and node.args:
                syms = {a.value for a in node.args[1:] if isinstance(a, ast.Constant)}
                out.append((node.args[0].value, syms | {k.arg for k in node.keywords}))
        return out

    @staticmethod
    def _bazelrc_opts() -> dict[str, list[str]]:
        """``build --copt / --conlyopt / --cxxopt`` of .bazelrc (the target configuration's, not --host_*)."""
        out: dict[str, list[str]] = {}
        with open(os.path.join(ROOT, ".bazelrc")) as f:
            for line in f:
                words = shlex.split(line, comments=True)
                if words[:1] != ["build"]:
                    continue
                for w in words[1:]:
                    m = re.match(r"--(copt|conlyopt|cxxopt)=(.*)", w)
                    if m:
                        out.setdefault(m.group(1), []).append(m.group(2))
        return out


class _Names:
    """ACTION_NAMES: each action's name as a string (ACTION_NAMES.c_compile == "c_compile")."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return name


def _caller_globals() -> dict:
    """The globals of the BUILD / .bzl file that called load()."""
    return inspect.currentframe().f_back.f_back.f_globals


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---- headers --------------------------------------------------------------------------------------------------------

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^">\n]+)[">]', re.M)


def included_headers(graph: BazelGraph, libs: list[Library]) -> set[str]:
    """Every file the libraries' sources include, transitively, resolved as the compiler would through each library's
    directories (the including file's folder for "..." includes, then the repository roots, then `includes`);
    system headers (not found in a repository) are left to the toolchain."""
    trees = sorted(((r.tree, name) for name, r in graph.repos.items()), key=lambda t: -len(t[0]))

    def locate(tree_path: str) -> tuple[Repo, str] | None:
        for prefix, name in trees:
            if tree_path.startswith(prefix + "/"):
                r = graph.repos[name]
                rel = tree_path[len(prefix) + 1:]
                return (r, rel) if r.has(rel) else None
        return None

    directives: dict[str, list[tuple[bytes, str]]] = {}
    found: set[str] = set()
    for lib in libs:
        dirs = lib.quote_dirs + lib.system_dirs
        todo = list(lib.srcs)
        seen = set(todo)
        while todo:
            f = todo.pop()
            if f not in directives:
                loc = locate(f)
                directives[f] = ([(m.group(1), m.group(2).decode()) for m in _INCLUDE.finditer(loc[0].read(loc[1]))]
                                 if loc else [])
            for kind, inc in directives[f]:
                cands = ([os.path.dirname(f)] if kind == b'"' else []) + dirs
                for d in cands:
                    p = os.path.normpath(os.path.join(d, inc)).replace(os.sep, "/")
                    if locate(p):
                        found.add(p)
                        if p not in seen:
                            seen.add(p)
                            todo.append(p)
                        break
    return found
