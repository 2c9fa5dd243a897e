"""How well an epoch's batches mix: sample-granular plans against shard-plus-buffer shuffling.

Labels only (no images are decoded), at ILSVRC2012 scale: 1,000 classes of 1,281 samples
(1,281,000) in 1,025 shards, for rank 0 of a 16 x 8 ranks x 8 workers x batch 256 job, and
for one rank of 2 workers x batch 32 over 8 shards of 1,000 samples, in two shard layouts:

- ``mixed``: samples placed in shards by a seeded permutation across all classes (what
  ``imgprep convert`` writes);
- ``sorted``: shards cut from a class-sorted list (what many hand-made shard sets hold).

``old``: each rank's shards, split over its workers by samples, each worker reading its
shards in order through a 1,000-sample shuffle buffer (the previous loader); ``v1``, ``v2``:
``loaders.epochs.plan_epoch`` with each epoch order version (``loaders.order``: numpy's
permutation, the keyed Feistel bijection). Printed per case: mean distinct classes and
distinct shards per batch, and what uniform random batches give (the ideal). Then the orders
themselves, per version (``order_stats``): how evenly 4,096 epochs of a 64-sample pool send
each position to each place (chi-square over degrees of freedom: about 1 for a uniform
family), how often neighbours in the order are neighbours in the pool (against 2/n), and the
rank correlation of order position and pool position at 1,281,167 (about 0 +- 1/sqrt(n)).
Last line: one JSON object.

Run: ``python -m bench.shuffle_quality``
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import numpy as np

from imgprep import World
from imgprep.job.assign import balanced_split
from loaders import PAD, plan_epoch

BUFFER = 1000
ORDERS = (1, 2)  # the epoch order versions compared


def shard_sizes(total: int, shards: int) -> list[int]:
    return [len(p) for p in np.array_split(np.arange(total), shards)]


def labels_for(layout: str, classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    """The label of every sample id (ids run shard by shard)."""
    labels = np.repeat(np.arange(classes), per_class)
    if layout == "mixed":
        labels = labels[np.random.default_rng(seed).permutation(len(labels))]
    return labels


def old_batches(sizes: Sequence[int], world: World, workers: int, batch: int,
                seed: int = 0) -> list[np.ndarray]:
    """Rank ``world.rank``'s batches under whole-shard plans with a shuffle buffer."""
    rng = np.random.default_rng([seed, 0, 1 << 31])
    ranks = balanced_split(sizes, world.world_size, rng.permutation(len(sizes)).tolist())
    mine = balanced_split(sizes, workers, ranks[world.rank])
    first = np.concatenate([[0], np.cumsum(sizes)])
    streams = []
    for w, shards in enumerate(mine):
        ids = np.concatenate([np.arange(first[i], first[i + 1]) for i in shards])
        r = np.random.default_rng([seed, 0, world.rank, w, 0xB0F])
        buf, out = list(ids[:BUFFER]), []
        for x in ids[BUFFER:].tolist():
            k = int(r.integers(len(buf)))
            out.append(buf[k])
            buf[k] = x
        out += [buf[k] for k in r.permutation(len(buf)).tolist()]
        streams.append([np.asarray(out[i:i + batch]) for i in range(0, len(out) - batch + 1,
                                                                      batch)])
    n = min(len(s) for s in streams)
    return [streams[w][j] for j in range(n) for w in range(workers)]


def new_batches(sizes: Sequence[int], world: World, workers: int, batch: int, version: int
                ) -> list[np.ndarray]:
    plan = plan_epoch(sizes, world, "replicate", 0, 0, batch, workers, "drop",
                      order_version=version)
    return [row for row in plan.table if (row != PAD).all()]  # full batches, as old gives


def spread(batches: list[np.ndarray], labels: np.ndarray, sizes: Sequence[int]
           ) -> dict[str, float]:
    first = np.concatenate([[0], np.cumsum(sizes)])
    classes = [len(np.unique(labels[b])) for b in batches]
    shards = [len(np.unique(np.searchsorted(first, b, side="right"))) for b in batches]
    return {"classes": round(float(np.mean(classes)), 1),
            "shards": round(float(np.mean(shards)), 1)}


def case(name: str, classes: int, per_class: int, shards: int, world: World, workers: int,
         batch: int) -> dict[str, object]:
    total = classes * per_class
    sizes = shard_sizes(total, shards)
    rng = np.random.default_rng(7)
    ideal = [rng.choice(total, batch, replace=False) for _ in range(50)]
    out: dict[str, object] = {"case": name, "batch": batch}
    for layout in ("mixed", "sorted"):
        labels = labels_for(layout, classes, per_class)
        out[layout] = {"old": spread(old_batches(sizes, world, workers, batch), labels, sizes),
                       **{f"v{v}": spread(new_batches(sizes, world, workers, batch, v), labels,
                                          sizes) for v in ORDERS},
                       "random": spread(ideal, labels, sizes)}
    return out


def order_of(n: int, epoch: int, version: int) -> np.ndarray:
    """Epoch ``epoch``'s whole order of an ``n``-sample set (one shard, one rank, seed 0)."""
    table = plan_epoch([n], World(), "replicate", 0, epoch, 1024, 1, "pad",
                       order_version=version).table.ravel()
    return table[table != PAD]


def order_stats(version: int, small: int = 64, epochs: int = 4096, big: int = 1_281_167
                ) -> dict[str, float]:
    """How random one version's orders look (see the module docstring)."""
    cells = np.zeros((small, small), np.int64)
    near = 0
    for e in range(epochs):
        o = order_of(small, e, version)
        cells[np.arange(small), o] += 1
        near += int((np.abs(np.diff(o)) == 1).sum())
    want = epochs / small
    chi2 = float(((cells - want) ** 2 / want).sum()) / ((small - 1) ** 2)
    o = order_of(big, 0, version)
    rho = float(np.corrcoef(np.arange(big), o)[0, 1])  # ranks: o is a permutation
    return {"chi2_per_dof": round(chi2, 3),
            "neighbours_over_expected": round(near / (epochs * (small - 1)) / (2 / small), 3),
            "rank_correlation": round(rho, 5)}


def main() -> int:
    results = [
        case("ILSVRC2012 16x8 ranks x 8 workers x 256", 1000, 1281, 1025,
             World(rank=0, world_size=128, local_rank=0, local_world_size=8, node_rank=0,
                   num_nodes=16), 8, 256),
        case("8,000 samples, 8 shards, 1 rank x 2 workers x 32", 100, 80, 8, World(), 2, 32),
    ]
    print(f"{'case':52s} {'layout':7s} {'order':7s} {'classes/batch':>14s} {'shards/batch':>13s}")
    for r in results:
        for layout in ("mixed", "sorted"):
            for order in ("old", *(f"v{v}" for v in ORDERS), "random"):
                v = r[layout][order]  # type: ignore[index]
                print(f"{r['case']:52s} {layout:7s} {order:7s} {v['classes']:14.1f} "
                      f"{v['shards']:13.1f}")
    orders = {f"v{v}": order_stats(v) for v in ORDERS}
    print(f"\n{'order':7s} {'chi2/dof (64 x 4096 epochs)':>28s} {'neighbours / 2/n':>17s} "
          f"{'rank corr. (1.28M)':>19s}")
    for name, o in orders.items():
        print(f"{name:7s} {o['chi2_per_dof']:28.3f} {o['neighbours_over_expected']:17.3f} "
              f"{o['rank_correlation']:19.5f}")
    print(json.dumps({"benchmark": "shuffle_quality", "results": results, "orders": orders},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
