"""Batch-level augmentation: random erasing, mixup and cutmix, drawn with the batch.

- What: ``RandomErasing`` (timm's ``RandomErasing``: rectangles of a batch's normalised
  images replaced by zeros or normal noise) and ``Mixup`` (timm's ``Mixup``: each image
  blended with its partner, or given a box of it, and the targets mixed in the same
  proportion, label smoothing folded in), the ``LoaderOptions`` fields ``random_erase`` and
  ``mixup``.
- Where drawn: by whoever decodes the batch (the pillow backend's workers, the dali and
  nvjpeg backends in the loader's process), once its labels are known, from the batch's own
  generator (``PlannedEpoch.batch_draws_rng``: seeded like the samples' generator of the
  batch, apart from it), so any worker count, any backend and a resume at any batch draw the
  same. Erasing and mixing draw from two streams of that generator (``Generator.spawn``):
  turning one on leaves the other's draws as they were.
- How they travel: one ``BatchDraws`` record per batch, packed to bytes in a fixed layout
  (``BatchDraws.pack``), by value beside the labels. With either option set the loader
  yields ``(images, labels, draws)``, ``draws`` a uint8 tensor of the packed record
  (``BatchDraws.unpack`` reads it back).
- Where applied: ``DeviceLoader``, on the device after normalisation: erasing, then mixing
  (``loaders.mixapply``).
- Rows: only real rows (label != ``PAD_LABEL``) are erased or mixed. timm pairs row i with
  row B-1-i (the batch flipped); here the real rows are paired among themselves the same
  way (the k-th real row with the k-th from the end), so padding never mixes in; a row
  paired with itself (a lone real row, the middle one of an odd count) is left as it is.
- The draws follow timm's definitions (``random_erasing.py``, ``mixup.py``) in the same
  order, with numpy's ``Generator`` in place of the global generators: per real row an erase
  coin, a count, then per rectangle up to ten (area, aspect) tries; mixup's coins and
  ``Beta(alpha, alpha)`` draws per batch, per pair or per row, then each cutmix box (timm's
  ``cutmix_bbox_and_lam``, its lam corrected to the box's clipped area).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from loaders.batch import PAD_LABEL

ERASE_MODES = ("const", "rand", "pixel")  # zeros, a normal value per channel, per pixel
MIX_MODES = ("batch", "pair", "elem")  # one draw per batch, per pair of rows, per row
MAX_ERASE_COUNT = 16  # the most rectangles one image may have erased (the record's layout)
ERASE_TRIES = 10  # timm's tries at a rectangle that fits
_MAGIC = 0x5844524157530001  # a packed BatchDraws record, layout version 1
_HEADER = 10  # int64 words: magic, rows, height, width, erase, K, seed, mix, classes, spare


def _pair(owner: object, name: str, value: Sequence[float], kind: type = float
          ) -> tuple[float, float]:
    """``value`` as a (low, high) pair of ``kind`` numbers, else a ValueError naming it."""
    if (not isinstance(value, Sequence) or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or (kind is int and not all(isinstance(v, int) for v in value))):
        raise ValueError(f"{type(owner).__name__}.{name} must be two {kind.__name__} numbers "
                         f"(low, high), not {value!r}")
    lo, hi = value
    object.__setattr__(owner, name, (kind(lo), kind(hi)))
    return kind(lo), kind(hi)


def _unit(owner: object, name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ValueError(f"{type(owner).__name__}.{name} must be a number in 0..1, not "
                         f"{value!r}")


@dataclass(frozen=True, kw_only=True)
class RandomErasing:
    """timm's ``RandomErasing``, on a batch's normalised images (``DeviceLoader``).

    Attributes:
        probability: that a real row is erased at all.
        area: of each rectangle, as a share of the image's area, drawn uniformly in this
            range and divided by the row's count (timm's ``min_area``, ``max_area``).
        aspect: a rectangle's height / width, drawn log-uniformly in this range (timm's
            ``min_aspect``, ``max_aspect``).
        mode: what fills a rectangle: ``"const"`` zeros (the mean colour after
            normalisation), ``"rand"`` one standard normal value per channel,
            ``"pixel"`` a standard normal value per pixel and channel.
        count: how many rectangles a row gets, drawn uniformly in this range, inclusive
            (timm's ``min_count``, ``max_count``); each is tried ten times and left out when
            no try fits inside the image.
    """

    probability: float = 0.25
    area: tuple[float, float] = (0.02, 1 / 3)
    aspect: tuple[float, float] = (0.3, 1 / 0.3)
    mode: str = "const"
    count: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        _unit(self, "probability", self.probability)
        lo, hi = _pair(self, "area", self.area)
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"RandomErasing.area must be 0 < low <= high <= 1, not {self.area}")
        lo, hi = _pair(self, "aspect", self.aspect)
        if not 0 < lo <= hi < math.inf:
            raise ValueError(f"RandomErasing.aspect must be 0 < low <= high, not {self.aspect}")
        if self.mode not in ERASE_MODES:
            raise ValueError(f"RandomErasing.mode must be one of {ERASE_MODES}, not "
                             f"{self.mode!r}")
        lo, hi = _pair(self, "count", self.count, int)
        if not 1 <= lo <= hi <= MAX_ERASE_COUNT:
            raise ValueError(f"RandomErasing.count must be 1 <= low <= high <= "
                             f"{MAX_ERASE_COUNT}, not {self.count}")


@dataclass(frozen=True, kw_only=True)
class Mixup:
    """timm's ``Mixup`` (mixup and cutmix), on a batch's normalised images and its targets
    (``DeviceLoader``).

    Attributes:
        mixup_alpha: mixup's lam ~ Beta(alpha, alpha); 0 turns mixup off.
        cutmix_alpha: cutmix's lam ~ Beta(alpha, alpha); 0 turns cutmix off.
        cutmix_minmax: a cutmix box's sides as shares of the image's, drawn uniformly in
            this range (timm's ``rand_bbox_minmax``) in place of the lam-sized box; turns
            cutmix on (its lam then drawn from Beta(1, 1), as timm forces, and corrected
            to the box).
        prob: that a batch (pair, row: ``mode``) is mixed at all.
        switch_prob: with both on, that cutmix is chosen rather than mixup.
        mode: ``"batch"`` (one draw for the batch), ``"pair"`` (one per pair of rows) or
            ``"elem"`` (one per row).
        correct_lam: a cutmix lam made 1 - (the box's area, clipped to the image) / (the
            image's area).
        label_smoothing: folded into the targets as timm's ``mixup_target``: off =
            smoothing / classes, on = 1 - smoothing + off.
        num_classes: the targets' width; None: the loader's class count.
    """

    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    cutmix_minmax: tuple[float, float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.1
    num_classes: int | None = None

    def __post_init__(self) -> None:
        for name in ("mixup_alpha", "cutmix_alpha"):
            a = getattr(self, name)
            if not isinstance(a, int | float) or isinstance(a, bool) or not 0 <= a < math.inf:
                raise ValueError(f"Mixup.{name} must be a number >= 0, not {a!r}")
        if self.cutmix_minmax is not None:
            lo, hi = _pair(self, "cutmix_minmax", self.cutmix_minmax)
            if not 0 < lo < hi <= 1:
                raise ValueError(f"Mixup.cutmix_minmax must be 0 < low < high <= 1, not "
                                 f"{self.cutmix_minmax}")
        if not (self.mixup_alpha > 0 or self.cutmix_on):
            raise ValueError("Mixup mixes nothing with mixup_alpha=0, cutmix_alpha=0 and no "
                             "cutmix_minmax: set one, or leave LoaderOptions.mixup None")
        _unit(self, "prob", self.prob)
        _unit(self, "switch_prob", self.switch_prob)
        if self.mode not in MIX_MODES:
            raise ValueError(f"Mixup.mode must be one of {MIX_MODES}, not {self.mode!r}")
        if not isinstance(self.correct_lam, bool):
            raise ValueError(f"Mixup.correct_lam must be a bool, not {self.correct_lam!r}")
        s = self.label_smoothing
        if not isinstance(s, int | float) or isinstance(s, bool) or not 0 <= s < 1:
            raise ValueError(f"Mixup.label_smoothing must be in 0..1 (1 excluded), not {s!r}")
        n = self.num_classes
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"Mixup.num_classes must be None or an integer >= 1, not {n!r}")

    @property
    def cutmix_on(self) -> bool:
        return self.cutmix_alpha > 0 or self.cutmix_minmax is not None

    @property
    def _cut_alpha(self) -> float:
        return 1.0 if self.cutmix_minmax is not None else self.cutmix_alpha

    def for_classes(self, classes: int | None) -> Mixup:
        """These options for a loader of ``classes`` classes (None: not known): its count
        where ``num_classes`` is None; a ValueError where the targets could not hold every
        label."""
        n = self.num_classes
        if n is None:
            if classes is None:
                raise ValueError("Mixup.num_classes is None and the loader does not know its "
                                 "class count: set Mixup(num_classes=...)")
            return replace(self, num_classes=classes)
        if classes is not None and n < classes:
            raise ValueError(f"Mixup.num_classes={n}, but the loader's labels go up to "
                             f"{classes - 1}: leave it None (the loader's {classes})")
        return self


@dataclass(frozen=True, eq=False, kw_only=True)
class BatchDraws:
    """One batch's draws (``draw_batch``), for images of ``height`` x ``width``: what
    ``DeviceLoader`` carries out. Per row (arrays of the batch's length):

    - ``counts`` (int32), ``rects`` (int32, rows x K x 4: top, left, height, width): the
      rectangles erased (the first ``counts[r]`` of row r), filled as ``erase_mode`` says
      (None: no erasing) from a ``torch.Generator`` seeded with ``noise_seed``;
    - ``partner`` (int32: the row mixed in; a row's own index: not mixed), ``lam`` (float64:
      the row's own share, cutmix's corrected; 1: not mixed), ``cut`` (bool: a cutmix row,
      else a blend) and ``box`` (int32, rows x 4: top, bottom, left, right, timm's ``yl, yu,
      xl, xu``: a cutmix row's region taken from its partner); ``mix_mode`` (None: no mixing),
      ``num_classes`` and ``label_smoothing`` make the soft targets.
    """

    height: int
    width: int
    erase_mode: str | None
    counts: np.ndarray
    rects: np.ndarray
    noise_seed: int
    mix_mode: str | None
    num_classes: int
    label_smoothing: float
    partner: np.ndarray
    lam: np.ndarray
    cut: np.ndarray
    box: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.partner)

    def pack(self) -> bytes:
        """The record in its fixed layout: 10 int64 header words, the smoothing (float64),
        then ``lam``, ``counts``, ``partner``, ``rects``, ``box``, ``cut`` (every part
        aligned to its item size)."""
        erase = -1 if self.erase_mode is None else ERASE_MODES.index(self.erase_mode)
        mix = -1 if self.mix_mode is None else MIX_MODES.index(self.mix_mode)
        head = np.array([_MAGIC, self.rows, self.height, self.width, erase,
                         self.rects.shape[1], self.noise_seed, mix, self.num_classes, 0],
                        np.int64)
        parts: list[np.ndarray] = [head, np.array([self.label_smoothing], np.float64),
                 self.lam.astype(np.float64), self.counts.astype(np.int32),
                 self.partner.astype(np.int32), self.rects.astype(np.int32),
                 self.box.astype(np.int32), self.cut.astype(np.uint8)]
        return b"".join(p.tobytes() for p in parts)

    @classmethod
    def unpack(cls, data: bytes | np.ndarray) -> BatchDraws:
        """A record from ``pack``'s bytes, or a uint8 array of them (a loader's draws
        tensor's ``.numpy()``)."""
        buf = np.frombuffer(data, np.uint8)
        head = buf[:8 * _HEADER].view(np.int64) if len(buf) >= 8 * _HEADER else None
        if head is None or int(head[0]) != _MAGIC:
            raise ValueError("not a packed BatchDraws record (BatchDraws.pack makes them)")
        b, h, w, erase, k, seed, mix, classes = (int(x) for x in head[1:9])
        if len(buf) != 8 * _HEADER + 8 + b * (8 + 4 + 4 + 16 * k + 16 + 1):
            raise ValueError(f"a packed BatchDraws record of {b} rows cut short or run on: "
                             f"{len(buf)} bytes")
        at = 8 * _HEADER

        def take(dtype: type, count: int) -> np.ndarray:
            nonlocal at
            size = np.dtype(dtype).itemsize * count
            out: np.ndarray = buf[at:at + size].copy().view(dtype)  # the record's own, writable
            at += size
            return out

        smoothing = float(take(np.float64, 1)[0])
        lam, counts, partner = take(np.float64, b), take(np.int32, b), take(np.int32, b)
        rects, box = take(np.int32, b * k * 4).reshape(b, k, 4), take(np.int32, b * 4)
        return cls(height=h, width=w, erase_mode=None if erase < 0 else ERASE_MODES[erase],
                   counts=counts, rects=rects, noise_seed=seed,
                   mix_mode=None if mix < 0 else MIX_MODES[mix], num_classes=classes,
                   label_smoothing=smoothing, partner=partner, lam=lam,
                   cut=take(np.uint8, b).astype(bool), box=box.reshape(b, 4))


def draw_batch(labels: np.ndarray, height: int, width: int, rng: np.random.Generator, *,
               erase: RandomErasing | None = None, mixup: Mixup | None = None) -> BatchDraws:
    """The draws of a batch of ``labels`` (``PAD_LABEL``: padding) at ``height`` x
    ``width`` from the batch's generator ``rng`` (``PlannedEpoch.batch_draws_rng``);
    ``mixup`` with its ``num_classes`` set (``Mixup.for_classes``)."""
    if mixup is not None and mixup.num_classes is None:
        raise ValueError("Mixup.num_classes is None: resolve it first (Mixup.for_classes)")
    labels = np.asarray(labels)
    real = np.flatnonzero(labels != PAD_LABEL)
    erase_rng, mix_rng = rng.spawn(2)
    counts, rects = _erase_draws(erase, len(labels), real, height, width, erase_rng)
    partner, lam, cut, box = _mix_draws(mixup, len(labels), real, height, width, mix_rng)
    return BatchDraws(
        height=height, width=width, erase_mode=None if erase is None else erase.mode,
        counts=counts, rects=rects, noise_seed=int(erase_rng.integers(1 << 63)),
        mix_mode=None if mixup is None else mixup.mode,
        num_classes=0 if mixup is None else int(mixup.num_classes or 0),
        label_smoothing=0.0 if mixup is None else float(mixup.label_smoothing),
        partner=partner, lam=lam, cut=cut, box=box)


def _erase_draws(e: RandomErasing | None, n: int, real: np.ndarray, height: int, width: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """timm's ``RandomErasing._erase`` for each real row in turn: (counts, rects)."""
    counts = np.zeros(n, np.int32)
    rects = np.zeros((n, 0 if e is None else e.count[1], 4), np.int32)
    if e is None:
        return counts, rects
    lo, hi = e.count
    for r in real.tolist():
        if rng.random() > e.probability:
            continue
        count = lo if lo == hi else int(rng.integers(lo, hi + 1))
        for _ in range(count):
            rect = _erase_rect(e, count, height, width, rng)
            if rect is not None:
                rects[r, counts[r]] = rect
                counts[r] += 1
    return counts, rects


def _erase_rect(e: RandomErasing, count: int, height: int, width: int,
                rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """One rectangle (top, left, height, width) of timm's, or None when no try fits."""
    log_lo, log_hi = math.log(e.aspect[0]), math.log(e.aspect[1])
    for _ in range(ERASE_TRIES):
        target = rng.uniform(*e.area) * height * width / count
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        h = int(round(math.sqrt(target * aspect)))
        w = int(round(math.sqrt(target / aspect)))
        if w < width and h < height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return None


def _mix_draws(m: Mixup | None, n: int, real: np.ndarray, height: int, width: int,
               rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """timm's ``Mixup`` draws over the real rows, each paired with its mirror among them:
    (partner, lam, cut, box) per row."""
    partner = np.arange(n, dtype=np.int32)
    lam, cut, box = np.ones(n), np.zeros(n, bool), np.zeros((n, 4), np.int32)
    if m is None:
        return partner, lam, cut, box
    partner[real] = real[::-1]
    k = len(real)
    if m.mode == "batch":
        groups = [real]
        draws = [_batch_params(m, rng)]
    else:
        pairs = m.mode == "pair"
        groups = [np.array([real[i], real[k - 1 - i]]) if pairs else real[i:i + 1]
                  for i in range(k // 2 if pairs else k)]
        draws = list(zip(*_elem_params(m, len(groups), rng), strict=True))
    for rows, (lam_i, cut_i) in zip(groups, draws, strict=True):
        if lam_i == 1.0:
            continue
        if cut_i:
            (top, bottom, left, right), lam_i = _cutmix_box(m, height, width, lam_i, rng)
            box[rows] = (top, bottom, left, right)
            cut[rows] = True
        lam[rows] = lam_i
    alone = partner == np.arange(n)  # padding, and a real row paired with itself
    lam[alone], cut[alone], box[alone] = 1.0, False, 0
    return partner, lam, cut, box


def _batch_params(m: Mixup, rng: np.random.Generator) -> tuple[float, bool]:
    """timm's ``Mixup._params_per_batch``: (lam, cutmix)."""
    if not rng.random() < m.prob:
        return 1.0, False
    if m.mixup_alpha > 0 and m.cutmix_on:
        cut = bool(rng.random() < m.switch_prob)
        a = m._cut_alpha if cut else m.mixup_alpha
        return float(rng.beta(a, a)), cut
    if m.mixup_alpha > 0:
        return float(rng.beta(m.mixup_alpha, m.mixup_alpha)), False
    return float(rng.beta(m._cut_alpha, m._cut_alpha)), True


def _elem_params(m: Mixup, n: int, rng: np.random.Generator) -> tuple[list[float], list[bool]]:
    """timm's ``Mixup._params_per_elem`` for ``n`` rows (or pairs): (lam, cutmix) each."""
    ca, ma = m._cut_alpha, m.mixup_alpha
    cut = np.zeros(n, bool)
    if ma > 0 and m.cutmix_on:
        cut = rng.random(n) < m.switch_prob
        lam_mix = np.where(cut, rng.beta(ca, ca, n), rng.beta(ma, ma, n))
    elif ma > 0:
        lam_mix = rng.beta(ma, ma, n)
    else:
        cut = np.ones(n, bool)
        lam_mix = rng.beta(ca, ca, n)
    lam = np.where(rng.random(n) < m.prob, lam_mix, 1.0)
    return [float(x) for x in lam], [bool(x) for x in cut]


def _cutmix_box(m: Mixup, height: int, width: int, lam: float, rng: np.random.Generator
                ) -> tuple[tuple[int, int, int, int], float]:
    """timm's ``cutmix_bbox_and_lam``: the box (top, bottom, left, right) and its lam."""
    if m.cutmix_minmax is not None:  # timm's rand_bbox_minmax
        lo, hi = m.cutmix_minmax
        cut_h = int(rng.integers(int(height * lo), max(int(height * hi), int(height * lo) + 1)))
        cut_w = int(rng.integers(int(width * lo), max(int(width * hi), int(width * lo) + 1)))
        top, left = int(rng.integers(0, height - cut_h)), int(rng.integers(0, width - cut_w))
        bottom, right = top + cut_h, left + cut_w
    else:  # timm's rand_bbox
        ratio = math.sqrt(1 - lam)
        cut_h, cut_w = int(height * ratio), int(width * ratio)
        cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
        top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
        left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
    if m.correct_lam or m.cutmix_minmax is not None:
        lam = 1.0 - (bottom - top) * (right - left) / float(height * width)
    return (top, bottom, left, right), lam
