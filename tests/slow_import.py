"""A correct target in a module slow to import: ``KDA_FUZZ_TEST_SLOW_IMPORT`` seconds (0 if
unset) in every process, or, with ``KDA_FUZZ_TEST_SLOW_WHERE=workers``, only in the
processes the command starts (a kernel library slow to import where the jobs run)."""

import multiprocessing
import os
import time

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode

if os.environ.get("KDA_FUZZ_TEST_SLOW_WHERE") != "workers" \
        or multiprocessing.parent_process() is not None:
    time.sleep(float(os.environ.get("KDA_FUZZ_TEST_SLOW_IMPORT", "0")))


def reference(*args):
    """The reference, as a target."""
    return reference_kda_packed_decode(*args)
