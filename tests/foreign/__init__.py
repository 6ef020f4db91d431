"""Third-party-style kernels of the packed KDA decode contract (test fixtures).

Written from the spec in the idioms real kernels use and the project's own kernels
avoid (scalar slot index, ``hl.arange`` offsets, whole-K slices), to check that the CPU
execution paths in ``kda_fuzz.execution.cpu`` run foreign kernels too.
"""
