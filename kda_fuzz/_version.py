"""The version of kda-fuzz (recorded in corpus files)."""

__version__ = "0.1.0"
