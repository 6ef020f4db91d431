"""This repository's own test sessions: under xdist (``pytest -n auto``), each worker's torch
ops get the worker's share of the cores, not all of them, and the longest tests start first;
the modules that register process-wide names are imported before any test.

Every worker (and every process a test starts: ``kda-fuzz`` commands, pytest sessions,
their campaign jobs) would otherwise run torch's intra-op pool on every core; with as many
workers as cores that is several spinning threads per core, and a default-sized campaign
took 140-200 s instead of 15-25 s on the loaded 2-core machine (two at once). An
``OMP_NUM_THREADS`` of the caller's is kept.
"""

from __future__ import annotations

import os


def _share() -> int | None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or not workers.isdigit() or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


SHARE = _share()
if SHARE is not None:
    os.environ["OMP_NUM_THREADS"] = str(SHARE)  # this worker's children, before they start


# The fast tier's longest tests (7-20 s each on the idle 2-core machine, most of them end to
# end through processes of their own), started first: xdist hands tests out in order, and
# one of them left for the end ran alone while the other worker idled. A scheduling hint
# only: a name here that no longer exists changes nothing.
LONGEST = (
    "tests/test_public_api.py::test_derived_contract_from_the_user_guide",
    "tests/test_variants.py::test_a_bug_of_one_helion_config_is_found_saved_with_it_and_replayed",
    "tests/test_findings_flow.py::test_a_signal_mid_campaign_saves_what_is_confirmed_and_",
    "tests/test_plugin.py::test_corpus_replays_against_the_users_configured_kernel",
    "tests/test_public_api.py::test_user_guide_example_from_outside_the_package",
    "tests/test_sanitize.py::test_errors_that_name_no_tensor_are_found_by_splitting_the_batch",
    "tests/test_sanitize.py::test_a_campaign_finds_saves_and_skips_replaying_it_without_a_gpu",
    "tests/test_merge.py::test_eight_shards_merge_into_one_file_per_distinct_failure",
    "tests/test_exampledb.py::test_pytest_sessions_share_failing_examples",
    "tests/test_plugin.py::test_a_hanging_target_fails_its_timeout_item_within_the_users_timeout",
    "tests/test_cli_front.py::test_replay_follows_each_files_family_and_variant",
    "tests/test_oracle.py::test_fused_judge_agrees_with_the_torch_oracle",
    "tests/test_cli_front.py::test_a_user_project_configuring_triton_fuzzes_its_triton_target",
    "tests/test_corpus.py::test_minimize_by_bytes_keeps_the_product_the_failure_needs",
    "tests/test_mutants.py::test_correct_twins_give_no_failure",
)


def _rank(nodeid: str) -> int:
    return next((i for i, p in enumerate(LONGEST) if nodeid.startswith(p)), len(LONGEST))


def pytest_collection_modifyitems(session: object, config: object, items: list) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # (stable: the rest keep their order)


def pytest_configure(config: object) -> None:
    if SHARE is not None:
        import torch

        torch.set_num_threads(SHARE)


def pytest_sessionstart(session: object) -> None:
    """Import the modules that register process-wide names (``BaseMarks``) before any test:
    a pytester session run in-process forgets the modules first imported during it, and a
    later import of one of them would register its names a second time (ValueError). Which
    test first imported them depended on how xdist dealt the tests."""
    import kda_fuzz.engine.recipe
    import kda_fuzz.engine.shrink
    import kda_fuzz.families.packed.shrink  # noqa: F401
