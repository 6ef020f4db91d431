"""Imported last by the fork server (``kda_fuzz.workers.process.worker_context``): first
the modules a server started early is told of later
(:func:`kda_fuzz.workers.process.import_later_preloads`), then, its imports done, the
garbage collector is turned back on (:mod:`kda_fuzz.workers.preloading` turned it off for
the imports) and the heap that every fork starts from is frozen once
(:func:`kda_fuzz.execution.compiles.freeze_heap`), so that no fork's garbage collections
walk it and a job's own start-up collection walks only what the job made. Not collected
first: that walk would delay every fork (0.36-0.42 s after torch, the engine and helion on
the 2-core machine). With the collector off for the imports it would find about 10,000
objects of garbage, kept and frozen with the rest (they are never touched again). Last,
the server is set to leave without the interpreter's teardown
(:func:`kda_fuzz.workers.process.exit_quietly_from_the_fork_server`)."""

import gc

from kda_fuzz.execution.compiles import freeze_heap
from kda_fuzz.workers.process import exit_quietly_from_the_fork_server, import_later_preloads

try:
    import_later_preloads()  # (a server started before the command chose its targets)
finally:
    gc.enable()  # (every fork collects its own garbage)
freeze_heap(collect=False)
exit_quietly_from_the_fork_server()
