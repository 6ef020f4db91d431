"""Targets whose outputs are right but whose memory accesses are not, for the sanitizer
tests (read with ``tests/fake_sanitizer.py`` standing in for compute-sanitizer on CPU)."""

from __future__ import annotations

from kda_fuzz_kernels.kda_decode import reference_kda_packed_decode


def reads_past_indices_of_wide_batches(*args):
    """Correct, but with more than two rows it "reads" past the end of
    ``ssm_state_indices`` (a value it then masks out): only the sanitizer sees it."""
    indices = args[8]
    if indices.device.type != "meta" and indices.ndim == 1 and indices.shape[0] > 2:
        print(f"FAKE-SANITIZER {indices.data_ptr():#x} "
              f"{indices.untyped_storage().nbytes()}", flush=True)
    return reference_kda_packed_decode(*args)


def slow_on_two_rows(*args):
    """Correct, but slow (3 s) on two-row batches: a process killed when such a case
    begins dies in the middle of it, whatever the machine's load."""
    import time

    if args[0].device.type != "meta" and args[0].shape[0] == 2:
        time.sleep(3.0)
    return reference_kda_packed_decode(*args)
