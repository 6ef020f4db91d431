"""The job channel: progress messages carry the growing maps of a job's counts as the
entries changed since its last message, and the supervisor makes them whole again."""

from __future__ import annotations

import copy
import pickle

from kda_fuzz.campaign.channel import Changes, received
from kda_fuzz.campaign.runner import campaign
from kda_fuzz.campaign.spec import CampaignSpec
from kda_fuzz.campaign.supervisor import Supervisor
from kda_fuzz.engine.targets import load_target
from kda_fuzz.families import get_contract

TRITON = "kda_fuzz_kernels.kda_decode:fused_recurrent_kda_packed_decode"


def _counters(n: int) -> dict:
    """A job's counters after ``n`` examples: one more layout each, the first one again
    and again, a new variant every ten examples (each example counted in the newest)."""
    layouts = {("valid", (k % 7, (("mixed_qkv", "float16", (k, 9)),))): 1 for k in range(n)}
    layouts[("valid", (0, (("mixed_qkv", "float16", (0, 9)),)))] = n
    variants = {f"k[{v}]": {"kernel": "k", "detail": "", "space": 0, "count": min(10, n - 10 * v),
                            "layout": f"B={v} " + "x" * 600, "size": v}
                for v in range(n // 10 + 1)}
    return {"examples": n, "variants": {"t": variants},
            "steering": {"layouts": layouts, "faulted": {}, "rejected": [(0, 1, n)]}}


def test_a_message_carries_what_changed_and_the_supervisor_sees_the_whole() -> None:
    job, whole, sizes = Changes(), None, []
    for n in range(1, 400):
        counters = _counters(n)
        message = pickle.dumps(job.sent(copy.deepcopy(counters)))
        sizes.append(len(message))
        whole = received(whole, pickle.loads(message))
        assert whole == counters
    assert len(pickle.dumps(_counters(399))) > 30_000
    # a message: the two layouts and one or two variants that changed, whatever came before
    assert max(sizes[50:]) < 3_000


def test_a_restarted_job_sends_everything_again_and_nothing_is_lost() -> None:
    job, whole = Changes(), None
    for n in range(1, 60):
        whole = received(whole, pickle.loads(pickle.dumps(job.sent(_counters(n)))))
    again = Changes()  # the job's new process, resumed from the counts at 59
    for n in range(59, 80):
        whole = received(whole, pickle.loads(pickle.dumps(again.sent(_counters(n)))))
        assert whole == _counters(n)


def test_jobs_variant_counts_add_up_to_their_examples() -> None:
    """Two supervised jobs (progress sent as changes, several messages each): every valid
    example counted once in the variant it ran, each variant with its smallest layout,
    as one in-process campaign counts its own."""
    options = dict(max_examples=10, seed=3, budget=512, max_b=4, valid_share=1.0)
    report = Supervisor(CampaignSpec.of("kda", "triton", [TRITON], jobs=2, **options)).run()
    alone = campaign(get_contract("kda"), "triton", [load_target(TRITON)], job=(0, 1),
                     **options)
    for r in (report, alone):
        seen = r.variants[TRITON]
        assert not r.failures and r.valid_cases == 10
        assert sum(v.count for v in seen.values()) == 10 and all(v.layout for v in seen.values())
    # (the jobs draw other cases than one campaign: the simplest case, B=H=HV=K=V=1, is
    # each job's first)
    assert [v.count for k, v in report.variants[TRITON].items() if "K=1, V=1, BK=1" in k] == [2]
