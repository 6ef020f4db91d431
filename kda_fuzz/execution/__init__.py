"""Running Helion and Triton kernels without a GPU (Triton's interpreter, Helion's eager mode).
"""

# the distributions whose versions a corpus file records beside python and torch
RUNTIMES = ("triton", "helion")


# What each kernel library imports that initialises no device when imported: a fork
# server may import these where a GPU is visible (it starts with torch's NVML-based CUDA
# check, kda_fuzz.workers.process), so that its workers do not import them each. helion
# among them: its import was what a GPU job's start-up mostly was, 8-11 s in each of 8
# jobs starting at once (benchmarks/startup_probe.py, H100, helion 1.4.0, torch 2.11);
# preloaded, the 8 jobs' start-up summed 23.6 s in one 30 s campaign (68-126 s in nine
# runs without it, on other machine starts). Without the NVML-based check, a process that
# imported helion left its forks unable to use CUDA ("Cannot re-initialize CUDA in forked
# subprocess"); a job that meets that error ends the campaign as the environment's
# failure. TorchDynamo and Inductor come with helion; jobs were seen frozen inside
# compiles on some H100 starts with and without them preloaded (the 2026-11-30 tree's
# too): a compile's stall is never a finding (execution/compiles.py).
# helion is imported without what only its autotuners use (kda_fuzz.execution.lean).
DEVICE_FREE_IMPORTS = {
    "triton": ("triton", "triton.language", "triton.runtime.jit"),
    "helion": ("triton", "triton.language", "triton.runtime.jit",
               "kda_fuzz.execution.lean_helion"),
}


def device_free_imports(libraries: list[str] | tuple[str, ...]) -> list[str]:
    """The modules of :data:`DEVICE_FREE_IMPORTS` for ``libraries`` that are installed."""
    import importlib.util

    out: list[str] = []
    for lib in libraries:
        try:
            found = importlib.util.find_spec(lib) is not None
        except (ImportError, ValueError):
            found = False
        for name in DEVICE_FREE_IMPORTS.get(lib, ()) if found else ():
            if name not in out:
                out.append(name)
    return out


def kernel_libraries(specs: list[str] | tuple[str, ...]) -> list[str]:
    """Those of :data:`RUNTIMES` installed here that a target (``MODULE:CALLABLE``) names:
    the sources its import runs (:func:`target_sources`) import it (``import helion``,
    ``from helion...``, ``import_module("helion...")``), or its callable's name contains
    it (``helion_fused_recurrent_kda_packed_decode``): what a worker forked for those
    targets will import.
    On a machine without a GPU neither starts anything on import that a fork would break,
    so a fork server may import them before it forks (a guess from the text: a wrong one
    costs an import, nothing else); where a GPU is visible, helion's import initialises
    CUDA, and a fork server must not import them. Nothing is imported but the targets'
    parent packages."""
    import importlib.util
    import re

    texts = [t for spec in specs for t in target_sources(spec)]
    names = [spec.partition(":")[2] for spec in specs]
    out = []
    for lib in RUNTIMES:
        imports = re.compile(rf"^\s*(?:import|from)\s+{lib}\b|import_module\(\s*[\"']{lib}\b",
                             re.M)
        if any(imports.search(t) for t in texts) or any(lib in n for n in names):
            try:
                if importlib.util.find_spec(lib) is not None:
                    out.append(lib)
            except (ImportError, ValueError):
                continue
    return out


SOURCE_DEPTH = 2  # imports within the target's package followed this many steps
SOURCE_FILES = 12  # at most this many files read per target


def target_sources(spec: str) -> list[str]:
    """The source texts that importing a target (``MODULE:CALLABLE``) and resolving its
    callable run, as far as they can be read without importing anything but the module's
    parent packages: the module's own; where the module does not define the callable
    itself (a package that loads it on first use, ``{"name": ".submodule"}``), the
    submodule named beside it; and, within the module's top-level package, the modules
    those import, ``SOURCE_DEPTH`` steps deep (``SOURCE_FILES`` at most)."""
    import importlib.util
    import re
    from pathlib import Path

    module, _, name = spec.partition(":")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):
        return []
    if found is None or not (found.origin or "").endswith(".py"):
        return []
    top = module.split(".")[0]
    try:
        top_dirs = [Path(d) for d in importlib.util.find_spec(top).submodule_search_locations
                    or ()]
    except (ImportError, ValueError, AttributeError):
        top_dirs = []

    def path_of(dotted: str) -> Path | None:
        parts = dotted.split(".")
        if parts[0] != top or not top_dirs:
            return None
        for root in top_dirs:
            base = root.joinpath(*parts[1:])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
        return None

    def package_of(dotted: str, path: Path) -> str:
        return dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]

    absolute = re.compile(rf"^\s*(?:from|import)\s+({re.escape(top)}(?:\.\w+)*)", re.M)
    relative = re.compile(r"^\s*from\s+(\.+)(\w+(?:\.\w+)*)?\s+import\s+([\w, ()]+)", re.M)
    defined = re.compile(rf"^(?:def|class|async\s+def)\s+{re.escape(name)}\b|"
                         rf"^{re.escape(name)}\s*[:=]|^\s*(?:from\s+\S+\s+)?import\s.*"
                         rf"\b{re.escape(name)}\b", re.M)
    texts: list[str] = []
    queue: list[tuple[str, Path, int]] = [(module, Path(found.origin or ""), 0)]
    seen: set[Path] = set()
    while queue and len(texts) < SOURCE_FILES:
        dotted, path, depth = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
        texts.append(text)
        package = package_of(dotted, path)
        named = [m.group(1) for m in absolute.finditer(text)]
        for m in relative.finditer(text):
            base = package.split(".")
            base = base[:len(base) - (len(m.group(1)) - 1)]
            stem = ".".join([*base, *filter(None, [m.group(2)])])
            named.append(stem)
            named += [f"{stem}.{w}" for w in re.findall(r"\w+", m.group(3))]
        if depth == 0 and name and not defined.search(text):  # loaded on first use
            quoted = rf"[\"']{re.escape(name)}[\"']"
            beside = re.findall(quoted + r"\s*:\s*\(?\s*[\"'](\.\w+(?:\.\w+)*)[\"']", text)
            if not beside:  # (any submodule named on a line that names the callable)
                beside = [sub for line in text.splitlines() if re.search(quoted, line)
                          for sub in re.findall(r"[\"'](\.\w+(?:\.\w+)*)[\"']", line)]
            named += [f"{package}{sub}" for sub in beside]
        if depth < SOURCE_DEPTH:
            for other in dict.fromkeys(named):
                where = path_of(other)
                if where is not None and where not in seen:
                    queue.append((other, where, depth + 1))
    return texts
