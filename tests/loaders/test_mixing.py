"""Batch-level augmentation (``loaders.mixing``, ``loaders.mixapply``, ``DeviceLoader``):
random erasing, mixup and cutmix drawn with each batch and carried out on the device.

- Draws against timm's definitions: each distribution compared by a Kolmogorov-Smirnov or
  chi-square test (p > 0.01, fixed seeds) with a transcription of timm's own code run on
  numpy's legacy generator and Python's ``random`` (what timm draws from), or with the
  distribution itself; exact relations (lam against the box) row by row.
- Exact values on the CPU for constructed batches, worked out by hand.
- Loaders: the draws travel with their batch; 0, 1 and 2 workers, a resumed epoch and the
  nvjpeg and DALI backends give the same draws; padding is never erased or mixed; real rows
  pair among themselves; the decoded pixels are as without the options.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from imgprep import World
from loaders import (
    PAD_LABEL,
    BatchDraws,
    DeviceLoader,
    LoaderOptions,
    Mixup,
    RandomErasing,
    ShardLoader,
    TrainTransform,
    draw_batch,
    normalize,
)
from loaders.mixapply import apply_draws
from tests.support import jpeg
from tests.support.shards import UNEQUAL_SIZES, write_split

P_MIN = 0.01
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ERASE = RandomErasing(probability=0.5, mode="pixel", count=(1, 2))
MIX = Mixup(mode="elem", prob=0.8)


# ---------------------------------------------------------------------------- statistics


def ks_p(d: float, n: float) -> float:
    """The Kolmogorov distribution's p-value of a KS statistic ``d`` over ``n`` (effective)
    samples (Stephens' small-sample correction)."""
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if lam < 0.2:
        return 1.0
    s = sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, 2 * s))


def ks_two(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample KS test: the p-value that ``a`` and ``b`` come from one distribution."""
    x, y = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([x, y])
    d = np.abs(np.searchsorted(x, grid, "right") / len(x)
               - np.searchsorted(y, grid, "right") / len(y)).max()
    return ks_p(float(d), len(x) * len(y) / (len(x) + len(y)))


def chi2_p(observed: Sequence[float], expected: Sequence[float], fitted: int = 0) -> float:
    """Pearson's chi-square goodness of fit: its p-value (the upper regularised gamma)."""
    o, e = np.asarray(observed, float), np.asarray(expected, float)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1 - fitted
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def binomial_p(hits: int, n: int, p: float) -> float:
    return chi2_p([hits, n - hits], [n * p, n * (1 - p)])


def test_the_tests_reject_what_differs() -> None:
    rng = np.random.default_rng(0)
    assert ks_two(rng.beta(0.8, 0.8, 3000), rng.beta(1.0, 1.0, 3000)) < P_MIN
    assert ks_two(rng.beta(0.8, 0.8, 3000), rng.beta(0.8, 0.8, 3000)) > P_MIN
    assert binomial_p(550, 1000, 0.5) < P_MIN
    assert chi2_p([30, 30, 40], [100 / 3] * 3) > P_MIN


# ---------------------------------------------------------------------------- timm's code


def timm_erase(r: random.Random, e: RandomErasing, h_img: int, w_img: int
               ) -> list[tuple[int, int]]:
    """timm's ``RandomErasing._erase`` for one image: each rectangle's (height, width)."""
    if r.random() > e.probability:
        return []
    area, out = h_img * w_img, []
    lo, hi = e.count
    count = lo if lo == hi else r.randint(lo, hi)
    log_aspect = (math.log(e.aspect[0]), math.log(e.aspect[1]))
    for _ in range(count):
        for _attempt in range(10):
            target = r.uniform(*e.area) * area / count
            aspect = math.exp(r.uniform(*log_aspect))
            h = int(round(math.sqrt(target * aspect)))
            w = int(round(math.sqrt(target / aspect)))
            if w < w_img and h < h_img:
                r.randint(0, h_img - h), r.randint(0, w_img - w)
                out.append((h, w))
                break
    return out


def timm_rand_bbox(rs: np.random.RandomState, h_img: int, w_img: int, lam: float
                   ) -> tuple[int, int, int, int]:
    """timm's ``rand_bbox`` (margin 0): (yl, yh, xl, xh)."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h_img * ratio), int(w_img * ratio)
    cy, cx = rs.randint(0, h_img), rs.randint(0, w_img)
    return (int(np.clip(cy - cut_h // 2, 0, h_img)), int(np.clip(cy + cut_h // 2, 0, h_img)),
            int(np.clip(cx - cut_w // 2, 0, w_img)), int(np.clip(cx + cut_w // 2, 0, w_img)))


def many(n_batches: int, rows: int, size: int = 224, seed: int = 0, **kwargs: Any
         ) -> list[BatchDraws]:
    labels = np.arange(rows) % 1000
    rng = np.random.default_rng(seed)
    return [draw_batch(labels, size, size, np.random.default_rng(rng.integers(1 << 62)),
                       **kwargs) for _ in range(n_batches)]


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("kind, bad", [
    (RandomErasing, {"probability": 1.5}), (RandomErasing, {"area": (0.0, 0.3)}),
    (RandomErasing, {"area": (0.5, 0.2)}), (RandomErasing, {"aspect": (2.0, 1.0)}),
    (RandomErasing, {"mode": "noise"}), (RandomErasing, {"count": (0, 2)}),
    (RandomErasing, {"count": (1, 99)}), (RandomErasing, {"area": 0.3}),
    (Mixup, {"mixup_alpha": -1.0}), (Mixup, {"mixup_alpha": 0.0, "cutmix_alpha": 0.0}),
    (Mixup, {"cutmix_minmax": (0.8, 0.2)}), (Mixup, {"prob": 2.0}),
    (Mixup, {"switch_prob": -0.1}), (Mixup, {"mode": "row"}),
    (Mixup, {"label_smoothing": 1.0}), (Mixup, {"num_classes": 0}),
    (Mixup, {"correct_lam": 1}),
])
def test_options_refuse_values_that_mean_nothing(kind: type, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=kind.__name__):
        kind(**bad)


def test_loader_options_take_only_the_records() -> None:
    with pytest.raises(ValueError, match="random_erase"):
        LoaderOptions(batch_size=4, random_erase=0.25)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mixup"):
        LoaderOptions(batch_size=4, mixup={"mixup_alpha": 0.8})  # type: ignore[arg-type]


def test_minmax_alone_turns_cutmix_on() -> None:
    m = Mixup(mixup_alpha=0.0, cutmix_alpha=0.0, cutmix_minmax=(0.2, 0.8), num_classes=10)
    d = draw_batch(np.arange(8), 64, 64, np.random.default_rng(1), mixup=m)
    assert d.cut.all()
    (top, bottom, left, right) = d.box.T
    assert ((bottom - top >= 12) & (bottom - top < 51) & (right - left >= 12)
            & (right - left < 51)).all()
    assert np.allclose(d.lam, 1 - (bottom - top) * (right - left) / 64 ** 2)


# ---------------------------------------------------------------------------- draws


def test_mixup_lam_is_beta_alpha_alpha_per_row_and_per_batch() -> None:
    m = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, mode="elem", num_classes=1000)
    lam = np.concatenate([d.lam for d in many(4, 1000, mixup=m)])
    ref = np.random.RandomState(7).beta(0.8, 0.8, len(lam))  # timm's np.random.beta
    assert ks_two(lam, ref) > P_MIN
    m = Mixup(mixup_alpha=0.4, cutmix_alpha=0.0, mode="batch", num_classes=1000)
    per_batch = [d.lam[0] for d in many(2000, 4, size=16, mixup=m)]
    assert ks_two(per_batch, np.random.RandomState(8).beta(0.4, 0.4, 2000)) > P_MIN
    assert ks_two(per_batch, np.random.RandomState(8).beta(0.8, 0.8, 2000)) < P_MIN


def test_switch_prob_and_prob_choose_as_often_as_they_say() -> None:
    m = Mixup(switch_prob=0.3, prob=0.6, mode="elem", correct_lam=False, num_classes=1000)
    ds = many(4, 1000, mixup=m)
    mixed = np.concatenate([d.lam != 1 for d in ds])
    cut = np.concatenate([d.cut for d in ds])
    assert binomial_p(int(mixed.sum()), len(mixed), 0.6) > P_MIN
    assert binomial_p(int(cut[mixed].sum()), int(mixed.sum()), 0.3) > P_MIN
    m = Mixup(switch_prob=0.3, prob=0.6, mode="batch", num_classes=1000)
    ds = many(1500, 4, size=16, mixup=m)
    mixed_b = [d.lam[0] != 1 for d in ds]
    cut_b = [bool(d.cut[0]) for d, x in zip(ds, mixed_b, strict=True) if x]
    assert binomial_p(sum(mixed_b), len(ds), 0.6) > P_MIN
    assert binomial_p(sum(cut_b), len(cut_b), 0.3) > P_MIN


def test_cutmix_box_area_is_timms_and_lam_is_corrected_to_it() -> None:
    m = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, mode="elem", correct_lam=False,
              num_classes=1000)
    ds = many(4, 1000, mixup=m)
    box = np.concatenate([d.box for d in ds])
    ours = (box[:, 1] - box[:, 0]) * (box[:, 3] - box[:, 2]) / 224 ** 2
    rs = np.random.RandomState(3)
    ref = []
    for lam in rs.beta(1.0, 1.0, len(ours)):
        yl, yh, xl, xh = timm_rand_bbox(rs, 224, 224, lam)
        ref.append((yh - yl) * (xh - xl) / 224 ** 2)
    assert ks_two(ours, ref) > P_MIN
    lam = np.concatenate([d.lam for d in ds])  # uncorrected: the Beta draw itself
    side = (224 * np.sqrt(1 - lam)).astype(int) // 2 * 2
    assert ((box[:, 1] - box[:, 0] <= side) & (box[:, 3] - box[:, 2] <= side)).all()
    m = Mixup(mixup_alpha=0.0, mode="elem", num_classes=1000)  # correct_lam=True
    for d in many(2, 500, mixup=m):
        area = (d.box[:, 1] - d.box[:, 0]) * (d.box[:, 3] - d.box[:, 2])
        assert np.array_equal(d.lam, 1.0 - area / float(224 * 224))


def test_erase_counts_areas_and_aspects_follow_timm() -> None:
    e = RandomErasing(probability=0.4, area=(0.02, 0.3), aspect=(0.5, 2.0), count=(1, 3))
    ds = many(6, 1000, erase=e)
    counts = np.concatenate([d.counts for d in ds])
    erased = counts[counts > 0]
    assert binomial_p(len(erased), len(counts), 0.4) > P_MIN
    assert chi2_p(np.bincount(erased, minlength=4)[1:], [len(erased) / 3] * 3) > P_MIN
    rects = np.concatenate([d.rects[r, :d.counts[r]] for d in ds for r in range(d.rows)])
    top, left, h, w = rects.T
    assert ((top >= 0) & (left >= 0) & (top + h <= 224) & (left + w <= 224)).all()
    r = random.Random(5)
    ref = [hw for _ in range(len(counts)) for hw in timm_erase(r, e, 224, 224)]
    ref_h, ref_w = np.array(ref).T
    assert ks_two(h * w, ref_h * ref_w) > P_MIN
    assert ks_two(h / w, ref_h / ref_w) > P_MIN
    assert (h / w >= 0.5 * 0.9).all() and (h / w <= 2.0 * 1.1).all()
    assert (h * w <= 0.3 * 224 ** 2 * 1.05).all() and (h * w >= 0.02 * 224 ** 2 / 3 * 0.9).all()


def test_padding_is_never_drawn_and_real_rows_pair_among_themselves() -> None:
    labels = np.array([5, PAD_LABEL, 7, 8, PAD_LABEL, 9, 2, PAD_LABEL])
    e = RandomErasing(probability=1.0)
    for mode in ("batch", "pair", "elem"):
        m = Mixup(mode=mode, prob=1.0, num_classes=10)
        d = draw_batch(labels, 32, 32, np.random.default_rng(4), erase=e, mixup=m)
        real = np.flatnonzero(labels != PAD_LABEL)  # 0 2 3 5 6
        pad = np.flatnonzero(labels == PAD_LABEL)
        assert d.partner[real].tolist() == real[::-1].tolist()
        assert d.partner[pad].tolist() == pad.tolist()
        assert (d.counts[pad] == 0).all() and (d.counts[real] > 0).all()
        assert (d.lam[pad] == 1).all() and not d.cut[pad].any()
        assert d.lam[3] == 1 and not d.cut[3]  # the middle real row pairs with itself
        if mode != "elem":  # a pair (and the batch) share one draw
            assert d.lam[0] == d.lam[6] and (d.box[0] == d.box[6]).all()
    lone = draw_batch(np.array([3, PAD_LABEL]), 32, 32, np.random.default_rng(0),
                      mixup=Mixup(num_classes=10))
    assert lone.partner.tolist() == [0, 1] and (lone.lam == 1).all()


def test_erasing_draws_do_not_move_when_mixup_is_turned_on() -> None:
    labels = np.arange(64)
    alone = draw_batch(labels, 64, 64, np.random.default_rng(9), erase=ERASE)
    both = draw_batch(labels, 64, 64, np.random.default_rng(9), erase=ERASE,
                      mixup=Mixup(num_classes=64))
    assert np.array_equal(alone.rects, both.rects) and alone.noise_seed == both.noise_seed


def test_a_record_packs_and_unpacks_whole() -> None:
    d = draw_batch(np.array([1, 2, PAD_LABEL, 4, 5]), 48, 40, np.random.default_rng(2),
                   erase=RandomErasing(probability=1.0, count=(1, 3), mode="rand"),
                   mixup=Mixup(mode="pair", num_classes=6, label_smoothing=0.2))
    back = BatchDraws.unpack(np.frombuffer(d.pack(), np.uint8))
    for name in ("counts", "rects", "partner", "lam", "cut", "box"):
        assert np.array_equal(getattr(back, name), getattr(d, name)), name
    assert (back.height, back.width, back.erase_mode, back.noise_seed, back.mix_mode,
            back.num_classes, back.label_smoothing) == (48, 40, "rand", d.noise_seed, "pair",
                                                         6, 0.2)
    with pytest.raises(ValueError, match="not a packed BatchDraws"):
        BatchDraws.unpack(b"\0" * 100)
    with pytest.raises(ValueError, match="cut short"):
        BatchDraws.unpack(d.pack()[:-1])


# ---------------------------------------------------------------------------- on the CPU


def record(**given: Any) -> BatchDraws:
    """A constructed record for 4 rows of 4 x 4: nothing drawn unless ``given`` says."""
    base: dict[str, Any] = {
        "height": 4, "width": 4, "erase_mode": None, "counts": np.zeros(4, np.int32),
        "rects": np.zeros((4, 1, 4), np.int32), "noise_seed": 11, "mix_mode": None,
        "num_classes": 4, "label_smoothing": 0.1, "partner": np.arange(4, dtype=np.int32),
        "lam": np.ones(4), "cut": np.zeros(4, bool), "box": np.zeros((4, 4), np.int32)}
    return BatchDraws(**(base | given))


def rows_of(*values: float) -> torch.Tensor:
    """4 images of 3 x 4 x 4, image r all ``values[r]``, channels_last."""
    x = torch.tensor(values, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 3, 4, 4)
    return x.contiguous(memory_format=torch.channels_last)


def test_erase_then_blend_and_cut_exact_on_the_cpu() -> None:
    d = record(erase_mode="const", counts=np.array([1, 0, 0, 0], np.int32),
               rects=np.array([[[1, 1, 2, 2]], [[0] * 4], [[0] * 4], [[0] * 4]], np.int32),
               mix_mode="pair", partner=np.array([3, 2, 1, 0], np.int32),
               lam=np.array([0.25, 0.75, 0.75, 0.25]), cut=np.array([False, True, True, False]),
               box=np.array([[0] * 4, [0, 2, 0, 2], [0, 2, 0, 2], [0] * 4], np.int32))
    images, targets = apply_draws(rows_of(1, 2, 3, 4), torch.tensor([0, 1, 2, 3]), d)
    want = torch.empty(4, 4, 4)
    want[0], want[0, 1:3, 1:3] = 3.25, 3.0  # 0.25 * 1 + 0.75 * 4; erased: 0.25 * 0 + 3
    want[3], want[3, 1:3, 1:3] = 1.75, 1.0  # 0.25 * 4 + 0.75 * 1; over the erased: + 0
    want[1], want[1, 0:2, 0:2] = 2.0, 3.0
    want[2], want[2, 0:2, 0:2] = 3.0, 2.0
    assert torch.allclose(images, want[:, None].expand(4, 3, 4, 4))
    assert images.is_contiguous(memory_format=torch.channels_last)
    # off = 0.1 / 4 = 0.025, on = 0.925: lam * own + (1 - lam) * partner's
    assert torch.allclose(targets, torch.tensor([[0.25, 0.025, 0.025, 0.7],
                                                 [0.025, 0.7, 0.25, 0.025],
                                                 [0.025, 0.25, 0.7, 0.025],
                                                 [0.7, 0.025, 0.025, 0.25]]), atol=1e-7)


def test_cut_boxes_of_their_own_and_rows_not_mixed_exact_on_the_cpu() -> None:
    d = record(mix_mode="elem", partner=np.array([3, 2, 1, 0], np.int32),
               lam=np.array([0.75, 0.75, 1.0, 1.0]), cut=np.array([True, True, False, False]),
               box=np.array([[0, 1, 0, 4], [2, 4, 2, 4], [0] * 4, [0] * 4], np.int32))
    images, targets = apply_draws(rows_of(1, 2, 3, 4), torch.tensor([0, 1, 2, 3]), d)
    want = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(4, 1, 1).repeat(1, 4, 4)
    want[0, 0, :] = 4.0
    want[1, 2:4, 2:4] = 3.0
    assert torch.equal(images, want[:, None].expand(4, 3, 4, 4))
    assert torch.allclose(targets, torch.tensor([[0.7, 0.025, 0.025, 0.25],
                                                 [0.025, 0.7, 0.25, 0.025],
                                                 [0.025, 0.025, 0.925, 0.025],
                                                 [0.025, 0.025, 0.025, 0.925]]), atol=1e-7)


def test_one_cutmix_box_for_the_batch_exact_on_the_cpu() -> None:
    d = record(mix_mode="batch", partner=np.array([2, 1, 0, 3], np.int32),
               lam=np.array([0.75, 1.0, 0.75, 1.0]), cut=np.array([True, False, True, False]),
               box=np.array([[1, 3, 0, 2], [0] * 4, [1, 3, 0, 2], [0] * 4], np.int32))
    labels = torch.tensor([0, 1, 2, PAD_LABEL])  # row 1 alone (the middle), row 3 padding
    images, targets = apply_draws(rows_of(1, 2, 3, 0), labels, d)
    want = torch.tensor([1.0, 2.0, 3.0, 0.0]).view(4, 1, 1).repeat(1, 4, 4)
    want[0, 1:3, 0:2], want[2, 1:3, 0:2] = 3.0, 1.0
    assert torch.equal(images, want[:, None].expand(4, 3, 4, 4))
    assert torch.allclose(targets, torch.tensor([[0.7, 0.025, 0.25, 0.025],
                                                 [0.025, 0.925, 0.025, 0.025],
                                                 [0.25, 0.025, 0.7, 0.025],
                                                 [0.0, 0.0, 0.0, 0.0]]), atol=1e-7)


@pytest.mark.parametrize("mode", ["rand", "pixel"])
def test_noise_comes_from_a_generator_seeded_by_the_batch(mode: str) -> None:
    rects = np.array([[[0, 1, 2, 3]], [[0] * 4], [[1, 0, 3, 1]], [[0] * 4]], np.int32)
    d = record(erase_mode=mode, counts=np.array([1, 0, 1, 0], np.int32), rects=rects)
    images, labels = apply_draws(rows_of(1, 2, 3, 4), torch.tensor([0, 1, 2, 3]), d)
    assert torch.equal(labels, torch.tensor([0, 1, 2, 3]))  # no mixup: labels as they came
    per = [3, 3] if mode == "rand" else [3 * 2 * 3, 3 * 3 * 1]
    noise = torch.randn(sum(per), generator=torch.Generator().manual_seed(11))
    first, second = noise[:per[0]], noise[per[0]:]
    shape = [(3, 1, 1), (3, 1, 1)] if mode == "rand" else [(3, 2, 3), (3, 3, 1)]
    assert torch.equal(images[0, :, 0:2, 1:4], first.view(shape[0]).expand(3, 2, 3))
    assert torch.equal(images[2, :, 1:4, 0:1], second.view(shape[1]).expand(3, 3, 1))
    outside = torch.ones(4, 4, dtype=torch.bool)
    outside[0:2, 1:4] = False
    assert (images[0][:, outside] == 1).all() and (images[1] == 2).all()
    again, _ = apply_draws(rows_of(1, 2, 3, 4), torch.tensor([0, 1, 2, 3]), d)
    assert torch.equal(images, again)


def test_device_loader_takes_pairs_and_triples() -> None:
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.integers(0, 256, (4, 3, 8, 8), dtype=np.uint8))
    labels = torch.tensor([1, 0, 2, PAD_LABEL])
    d = draw_batch(labels.numpy(), 8, 8, np.random.default_rng(5),
                   mixup=Mixup(num_classes=3, mode="elem"))
    draws = torch.frombuffer(bytearray(d.pack()), dtype=torch.uint8)
    plain = list(DeviceLoader([(x, labels)], "cpu", MEAN, STD))
    mixed = list(DeviceLoader([(x, labels, draws)], "cpu", MEAN, STD))
    assert torch.equal(plain[0][1], labels)
    norm = normalize(x, torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1))
    assert torch.equal(plain[0][0], norm)
    images, targets = mixed[0]
    assert targets.shape == (4, 3) and targets.dtype == torch.float32
    assert torch.allclose(targets[:3].sum(1), torch.ones(3)) and (targets[3] == 0).all()
    assert torch.equal(images[3], norm[3])  # padding: as normalised
    with pytest.raises(ValueError, match="draws are for 4 rows of 8 x 8"):
        list(DeviceLoader([(x[:, :, :4, :4], labels, draws)], "cpu", MEAN, STD))
    with pytest.raises(ValueError, match="not 1 items"):
        list(DeviceLoader([(x,)], "cpu", MEAN, STD))


# ---------------------------------------------------------------------------- loaders


def image(i: int) -> bytes:
    return jpeg((48 + i % 7, 40 + i % 5), seed=300 + i)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mixing")
    write_split(out, "train", UNEQUAL_SIZES, image)  # 57 samples
    return out


def loader(data: Path, **given: Any) -> ShardLoader:
    options: dict[str, Any] = {"batch_size": 6, "workers": 0, "seed": 5,
                               "transform": TrainTransform(size=32), "random_erase": ERASE,
                               "mixup": MIX}
    return ShardLoader(data, "train", World(), LoaderOptions(**(options | given)))


def epoch(ld: ShardLoader) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(t.clone() for t in b) for b in ld]


def on_cpu(ld: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in DeviceLoader(ld, "cpu", MEAN, STD)]


def same(a: Sequence[Sequence[torch.Tensor]], b: Sequence[Sequence[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(s, t) for s, t in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True))


def test_batches_carry_their_draws_and_the_pixels_stay_as_decoded(data: Path) -> None:
    ld = loader(data)
    assert ld.options.mixup is not None and ld.options.mixup.num_classes == 1000  # manifest
    batches = epoch(ld)
    assert all(len(b) == 3 and b[2].dtype == torch.uint8 for b in batches)
    plain = epoch(loader(data, random_erase=None, mixup=None))
    assert all(len(b) == 2 for b in plain)
    assert same([b[:2] for b in batches], plain)  # the samples' own draws untouched
    for _, labels, draws in batches:
        d = BatchDraws.unpack(draws.numpy())
        assert (d.rows, d.height, d.width, d.num_classes) == (len(labels), 32, 32, 1000)
    with pytest.raises(ValueError, match="num_classes=10"):
        loader(data, mixup=Mixup(num_classes=10))


def test_worker_counts_give_the_same_draws_and_mixes(data: Path) -> None:
    results = [(epoch(ld), on_cpu(ld)) for ld in (loader(data, workers=w) for w in (0, 1, 2))]
    for batches, mixed in results[1:]:
        assert same(batches, results[0][0]) and same(mixed, results[0][1])


def test_a_resumed_epoch_draws_and_mixes_as_the_uninterrupted_one(data: Path) -> None:
    whole = loader(data, workers=2)
    want, want_mixed = epoch(whole), on_cpu(whole)
    first = loader(data, workers=2)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    again = loader(data, workers=2)
    again.load_state_dict(state)
    rest = epoch(again)
    again.load_state_dict(state)
    assert same(rest, want[4:]) and same(on_cpu(again), want_mixed[4:])


def test_padding_rows_are_never_erased_or_mixed(data: Path) -> None:
    every = RandomErasing(probability=1.0, mode="pixel")
    ld = loader(data, tail="pad", shuffle=False, random_erase=every,
                mixup=Mixup(mode="elem", num_classes=1000))
    batches, mixed = epoch(ld), on_cpu(ld)
    zero = normalize(torch.zeros(1, 3, 32, 32, dtype=torch.uint8),
                     torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1))
    last_labels = batches[-1][1]
    pad = last_labels == PAD_LABEL
    assert pad.sum() == 3  # 57 samples in batches of 6
    images, targets = mixed[-1]
    assert all(torch.equal(row, zero[0]) for row in images[pad])
    assert (targets[pad] == 0).all()
    assert torch.allclose(targets[~pad].sum(1), torch.ones(int((~pad).sum())))
    for (_, labels, draws), (_, t) in zip(batches, mixed, strict=True):
        d = BatchDraws.unpack(draws.numpy())
        real = labels.numpy() != PAD_LABEL
        assert (labels.numpy()[d.partner] != PAD_LABEL).tolist() == real.tolist()
        assert d.counts[real].sum() > 0 and (d.counts[~real] == 0).all()
        assert torch.allclose(t, soft(labels, d, 1000), atol=1e-6)


def soft(labels: torch.Tensor, d: BatchDraws, k: int) -> torch.Tensor:
    """The soft targets by timm's ``mixup_target`` formula, row by row."""
    out = torch.zeros(len(labels), k, dtype=torch.float64)
    off = d.label_smoothing / k
    for r, y in enumerate(labels.tolist()):
        if y == PAD_LABEL:
            continue
        y2 = int(labels[int(d.partner[r])])
        one, two = torch.full((k,), off, dtype=torch.float64), torch.full(
            (k,), off, dtype=torch.float64)
        one[y], two[y2] = 1 - d.label_smoothing + off, 1 - d.label_smoothing + off
        out[r] = one * d.lam[r] + two * (1 - d.lam[r])
    return out.float()


@pytest.mark.parametrize("backend", ["nvjpeg", "dali"])
def test_in_process_backends_draw_as_the_pillow_backend(data: Path, backend: str) -> None:
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    want = epoch(loader(data))
    got = epoch(loader(data, backend=backend))
    assert [b[1].tolist() for b in got] == [b[1].tolist() for b in want]
    assert all(torch.equal(g[2], w[2]) for g, w in zip(got, want, strict=True))
    assert len(on_cpu(loader(data, backend=backend))) == len(want)


@pytest.mark.gpu
def test_on_cuda_the_draws_make_the_cpu_batches_and_the_noise_repeats() -> None:
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8))
    labels = torch.tensor([1, 4, 0, 2, PAD_LABEL, 3])
    for mode in ("batch", "pair", "elem"):
        for erase in ("const", "pixel"):
            d = draw_batch(labels.numpy(), 32, 32, np.random.default_rng(len(mode)),
                           erase=RandomErasing(probability=0.7, mode=erase, count=(1, 2)),
                           mixup=Mixup(mode=mode, num_classes=5))
            batch = [(x, labels, torch.frombuffer(bytearray(d.pack()), dtype=torch.uint8))]
            cpu = list(DeviceLoader(batch, "cpu", MEAN, STD))[0]
            gpu = [list(DeviceLoader(batch, "cuda", MEAN, STD))[0] for _ in range(2)]
            assert torch.equal(gpu[0][0], gpu[1][0])  # the same noise on every pass
            assert torch.allclose(gpu[0][1].cpu(), cpu[1], atol=1e-6)
            if erase == "const":
                assert torch.allclose(gpu[0][0].cpu(), cpu[0], atol=1e-5)
