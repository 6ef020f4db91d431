"""Imported first by the fork server (``kda_fuzz.workers.process.PRELOAD``): the garbage
collector stays off while the server imports torch, the engine and the kernel libraries,
until :mod:`kda_fuzz.workers.preloaded`, imported last, turns it back on. Those imports
make millions of objects that live as long as the process; the collector's walks over
them find nothing and took about a fifth of the import time (torch then helion on the
2-core machine: 1.1-1.3 s and 3.1-3.6 s with it on, 0.9-1.1 s and 2.5-2.7 s off).
Bytecode compiled by those imports is kept where the command chose
(:mod:`kda_fuzz.workers.bytecode`)."""

import gc

from kda_fuzz.workers.bytecode import keep_bytecode

gc.disable()
keep_bytecode()
