"""helion, imported by a fork server without what only its autotuners use
(:mod:`kda_fuzz.execution.lean`); named in :data:`kda_fuzz.execution.DEVICE_FREE_IMPORTS`."""

from kda_fuzz.execution.lean import import_lean

import_lean("helion")
