"""The extension's crop draws (``imgprep.cropdraw``) are the Python reference's
(``loaders.transforms.crop_box``, then the flip): the same box and flip for any image size,
scale and ratio range, from any numpy bit generator in any state, and the generator left
exactly where the Python draws leave it; the transform uses them, and still draws the same
where they are not built."""

from __future__ import annotations

import numpy as np
import pytest

from imgprep import cropdraw
from loaders import transforms
from loaders.transforms import TrainTransform, crop_box

pytestmark = pytest.mark.skipif(not cropdraw.AVAILABLE, reason="the extension is not built")

BIT_GENERATORS = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64,
                  np.random.MT19937)


def by_python(rng: np.random.Generator, w: int, h: int, t: TrainTransform
              ) -> tuple[tuple[int, int, int, int], bool]:
    box = crop_box(w, h, t, rng)
    return box, t.flip and bool(rng.random() < 0.5)  # type: ignore[return-value]


def cases(n: int, seed: int) -> list[tuple[int, int, TrainTransform]]:
    """Sizes from 1 px to past the 32-bit-range edge cases, and scale and ratio ranges from
    the recipes' to degenerate ones (a single value, ranges that rarely fit: the fallback)."""
    r = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = (int(v) for v in r.integers(1, [4000, 4000] if i % 7 else [4, 65500]))
        lo = float(r.uniform(1e-4, 1))
        ratio_lo = float(r.uniform(0.01, 4))
        kinds = [TrainTransform(),
                 TrainTransform(scale=(lo, float(r.uniform(lo, 1))),
                                ratio=(ratio_lo, float(r.uniform(ratio_lo, 20))),
                                flip=bool(i % 2)),
                 TrainTransform(scale=(1.0, 1.0), ratio=(ratio_lo, ratio_lo))]
        out.append((w, h, kinds[i % 3]))
    return out


@pytest.mark.parametrize("bitgen", BIT_GENERATORS, ids=lambda b: b.__name__)
def test_the_c_draws_are_the_python_draws_and_leave_the_generator_where_they_do(bitgen):
    for k, (w, h, t) in enumerate(cases(600, 5)):
        a, b = np.random.Generator(bitgen(k)), np.random.Generator(bitgen(k))
        if k % 2:  # a 32-bit half left buffered in the bit generator by an earlier draw
            a.integers(0, 3)
            b.integers(0, 3)
        want = by_python(a, w, h, t)
        assert cropdraw.crop_draw(b, w, h, t.scale, t.ratio, t.flip) == want, (w, h, t)
        after = [(g.integers(0, 1000), g.random(), g.integers(0, 2**40)) for g in (a, b)]
        assert after[0] == after[1], (w, h, t)  # the same place, the buffered half too


def test_the_transform_draws_the_same_geometry_with_and_without_the_extension(monkeypatch):
    t = TrainTransform(size=96)
    sizes = [(341, 256), (256, 256), (1, 1), (3, 5000), (65500, 2)]
    with_c = [t.geometry(w, h, np.random.default_rng(i)) for i, (w, h) in enumerate(sizes)]
    monkeypatch.setattr(transforms.cropdraw, "AVAILABLE", False)
    assert [t.geometry(w, h, np.random.default_rng(i))
            for i, (w, h) in enumerate(sizes)] == with_c


@pytest.mark.parametrize("bad", [dict(w=0), dict(h=65501), dict(scale=(0.5, 0.4)),
                                 dict(scale=(0.0, 1.0)), dict(ratio=(1.0, float("inf")))])
def test_arguments_outside_the_transforms_ranges_are_refused(bad):
    args = dict(w=10, h=10, scale=(0.08, 1.0), ratio=(0.75, 4 / 3)) | bad
    with pytest.raises(ValueError):
        cropdraw.crop_draw(np.random.default_rng(0), args["w"], args["h"], args["scale"],
                           args["ratio"], True)
