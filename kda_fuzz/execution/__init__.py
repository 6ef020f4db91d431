"""Running Helion and Triton kernels without a GPU (Triton's interpreter, Helion's eager mode).
"""

# the distributions whose versions a corpus file records beside python and torch
RUNTIMES = ("triton", "helion")


# What each kernel library imports that starts nothing on a device when imported: a fork
# server may import these where a GPU is visible, so that its workers do not import them
# each (seconds apiece where Python may not write bytecode). The library itself is left to
# the workers, and so are TorchDynamo, Inductor and the scikit-learn of Helion's autotuner:
# with those imported by the fork server (974f32d), Helion campaigns on an H100 saw their
# jobs stop in the middle of an example until the deadline killed them (job samples: every
# job's main thread silent after 9 of 35 s, 20 examples in a 40 s campaign, against 1,605
# for a tree whose jobs import them themselves; the Triton contract, which preloads Triton
# alone, ran at 0.97x of it on the same start).
DEVICE_FREE_IMPORTS = {
    "triton": ("triton", "triton.language", "triton.runtime.jit"),
    "helion": ("triton", "triton.language", "triton.runtime.jit"),
}


def device_free_imports(libraries: list[str] | tuple[str, ...]) -> list[str]:
    """The modules of :data:`DEVICE_FREE_IMPORTS` for ``libraries`` that are installed."""
    import importlib.util

    out: list[str] = []
    for lib in libraries:
        for name in DEVICE_FREE_IMPORTS.get(lib, ()):
            try:
                found = importlib.util.find_spec(name.split(".")[0]) is not None
            except (ImportError, ValueError):
                found = False
            if found and name not in out:
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
