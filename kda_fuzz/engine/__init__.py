"""The engine: cases, contracts as data, verdicts, the oracle, shrink primitives and target
loading.

It knows no kernel family: every family-specific fact comes from a
:class:`~kda_fuzz.engine.contract.Contract`.
"""
