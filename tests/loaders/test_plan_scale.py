"""Sample-granular plans at the scale of real jobs, on ILSVRC2012's shard counts.

The default conversion of ILSVRC2012 train is 1,025 shards (1,024 of 1,250 samples and one
of 1,167: 1,281,167 images). Whole-shard plans saw 81.8 % of it per epoch at 16 x 8 ranks x 8
workers x batch 256, kept 7 of 8 workers idle at 128 x 8 ranks, and refused 256 x 8 ranks.
Each job here is planned from counts alone (vectorised: no per-sample Python loop) and
checked: >= 99.9 % of the set per epoch in short mode, every worker within one batch of its
siblings and busy, no refusal; a few ranks' actual plans are checked against the summary.
"""

from __future__ import annotations

import numpy as np
import pytest

from imgprep.job.world import World
from loaders.epochs import job_summary, plan_epoch, pool_order, pools

ILSVRC = [1250] * 1024 + [1167]
JOBS = {  # nodes, ranks per node, workers per rank, batch per rank
    "16x8-w8-b256": (16, 8, 8, 256),
    "128x8-w8-b32": (128, 8, 8, 32),
    "256x8-w8-b32": (256, 8, 8, 32),
}


@pytest.mark.parametrize("job", list(JOBS))
def test_replicate_sees_the_set_with_every_worker_busy(job: str) -> None:
    nodes, local, workers, batch = JOBS[job]
    s = job_summary(ILSVRC, nodes, local, workers, batch, tail="short")
    assert s.seen >= 0.999, s
    assert s.busy_workers == workers, s
    assert s.worker_spread <= batch, s
    ranks = nodes * local
    assert sum(ILSVRC) - s.seen * sum(ILSVRC) < ranks * batch  # < batch lost per rank


@pytest.mark.parametrize("job", list(JOBS))
def test_rank_plans_match_the_summary_and_never_overlap(job: str) -> None:
    """Actual plans of the first and last rank of the first and last node: the stated step
    count, the worker split, and disjoint samples taken from the epoch's order."""
    nodes, local, workers, batch = JOBS[job]
    s = job_summary(ILSVRC, nodes, local, workers, batch, tail="short")
    ranks = nodes * local
    order = pool_order(pools(ILSVRC, nodes, "replicate", 0)[0], 0, 3, 0, True)
    seen: list[np.ndarray] = []
    for r in (0, local - 1, ranks - local, ranks - 1):
        world = World(rank=r, world_size=ranks, local_rank=r % local, local_world_size=local,
                      node_rank=r // local, num_nodes=nodes)
        plan = plan_epoch(ILSVRC, world, "replicate", 0, 3, batch, workers, "short")
        assert plan.batches == s.steps
        counts = plan.worker_samples
        assert min(counts) > 0 and max(counts) - min(counts) <= batch
        full = plan.table[:-1]  # the last step is short: < batch per rank, equal on all
        want = order[(np.arange(len(full))[:, None] * ranks + r) * batch
                     + np.arange(batch)[None, :]]
        assert np.array_equal(full, want)
        last = plan.table[-1][plan.table[-1] != -1]
        assert 2 <= len(last) < batch
        seen.append(plan.table[plan.table != -1])
    flat = np.concatenate(seen)
    assert len(np.unique(flat)) == len(flat)


@pytest.mark.parametrize("job", list(JOBS))
def test_partition_loses_less_than_a_batch_per_rank_beyond_node_equality(job: str) -> None:
    """Partition mode: nodes hold whole shards (counts differ by up to a shard), and every
    rank must take the same steps; beyond that, each node loses < batch per rank."""
    nodes, local, workers, batch = JOBS[job]
    s = job_summary(ILSVRC, nodes, local, workers, batch, mode="partition")
    sizes = [len(p) for p in pools(ILSVRC, nodes, "partition", 0)]
    lost = sum(ILSVRC) - s.seen * sum(ILSVRC)
    assert lost - sum(n - min(sizes) for n in sizes) < nodes * local * batch
    assert s.busy_workers == workers and s.steps > 0


@pytest.mark.parametrize("tail", ["pad", "uneven"])
def test_exact_tails_see_everything_at_scale(tail: str) -> None:
    s = job_summary(ILSVRC, 256, 8, 8, 32, tail=tail)
    assert s.seen == 1.0
