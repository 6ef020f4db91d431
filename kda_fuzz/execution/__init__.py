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
    its module's source imports it (``import helion``, ``from helion...``,
    ``import_module("helion...")``) or its callable's name contains it
    (``helion_fused_recurrent_kda_packed_decode``, whose package loads it lazily): what a
    worker forked for those targets will import.
    On a machine without a GPU neither starts anything on import that a fork would break,
    so a fork server may import them before it forks (a guess from the text: a wrong one
    costs an import, nothing else); where a GPU is visible, helion's import initialises
    CUDA, and a fork server must not import them. Nothing is imported but the targets'
    parent packages."""
    import importlib.util
    import re
    from pathlib import Path

    texts, names = [], []
    for spec in specs:
        module, _, name = spec.partition(":")
        names.append(name)
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError, AttributeError):
            continue
        origin = getattr(found, "origin", None)
        if origin and origin.endswith(".py"):
            try:
                texts.append(Path(origin).read_text(encoding="utf-8", errors="ignore"))
            except OSError:
                continue
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
