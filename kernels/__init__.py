"""Kernels under test by kda-fuzz."""
