"""Imported last by the fork server (``kda_fuzz.workers.process.worker_context``): its
imports done, the heap that every fork starts from is collected and frozen once
(:func:`kda_fuzz.execution.compiles.freeze_heap`), so that no fork's garbage collections
walk it and a job's own start-up collection walks only what the job made."""

from kda_fuzz.execution.compiles import freeze_heap

freeze_heap()
