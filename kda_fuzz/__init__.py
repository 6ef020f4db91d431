"""kda-fuzz: differential fuzzing and regression tests for packed KDA decode kernels."""

from . import _kernels_path

__version__ = "0.1.0"

_kernels_path.install()
