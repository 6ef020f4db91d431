"""A module that writes to stderr as the interpreter ends (an exit handler, as a kernel
library's bindings can write then: triton 3.9's nanobind reports leaked types)."""

import atexit
import sys

atexit.register(lambda: sys.stderr.write("loud_teardown: torn down\n"))
