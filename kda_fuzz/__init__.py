"""kda-fuzz: differential fuzzing and regression tests for packed KDA decode kernels."""

__version__ = "0.1.0"
