"""Writer process of the corpus concurrency test.

Imports nothing but ``kda_fuzz.corpus.atomic`` (no torch): sixteen spawned interpreters that
each import torch take a minute on a small CI machine, while what races between
processes is the file writing itself. The entries are encoded by the parent with
``kda_fuzz.corpus.store.encode_entry`` (what ``save_case`` writes).
"""

from __future__ import annotations

from typing import Any


def write(directory: str, entries: list[tuple[str, str]], barrier: Any, rounds: int = 3) -> None:
    """Wait for every writer, then write each (file name, text) entry ``rounds`` times."""
    from kda_fuzz.corpus.atomic import write_atomic

    barrier.wait()
    for _ in range(rounds):
        for name, text in entries:
            write_atomic(f"{directory}/{name}", text)
