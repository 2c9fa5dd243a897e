"""Augmentation in the loader: every decode path carries a policy's ops out on the row it
wrote (the crop-aware and whole decodes, the Pillow-decoded fallback, the Pillow path), so
the batches are the same for any worker count, after a resume, elastic or not, and with
``crop_decode=False`` where pillow-simd decodes as the extension does; the ops give the
pixels stock Pillow 13's own calls give (the calls torchvision 0.20.1's and timm v1.0.28's
PIL paths make), checked in the stock-Pillow environment ``make setup`` builds
(``build/pillow-reference``); the pixel version names the augmentation, and a resume across
it is refused; the dali and nvjpeg backends, and a build without the extension, refuse a
policy when the options are made."""

from __future__ import annotations

import hashlib
import io
import json
import math
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from imgprep import jpegcrop
from imgprep.augment import apply as apply_ops
from imgprep.job.world import World
from imgprep.shards.info import pil_info
from loaders import LoaderOptions, ShardLoader, TrainTransform
from loaders.augment import policy
from loaders.augment_step import Step
from loaders.decode import SampleDecoder
from loaders.errors import LoaderError
from loaders.transforms import apply, crop_box
from tests.support import jpeg
from tests.support.images import encode, photo
from tests.support.paths import REPO
from tests.support.pillow_reference import digest
from tests.support.shards import UNEQUAL_SIZES, write_split

pytestmark = pytest.mark.skipif(not jpegcrop.AVAILABLE,
                                reason=f"crop-aware decoder: {jpegcrop.status()}")

TOTAL = sum(UNEQUAL_SIZES)  # 57
SIZE = 32
TIMM = TrainTransform(size=SIZE, augment=policy("rand-m9-mstd0.5-inc1"))
PLAIN = TrainTransform(size=SIZE)
Batch = tuple[torch.Tensor, torch.Tensor]


def image(i: int) -> bytes:
    """Sample ``i``: baseline JPEGs (the crop-aware decode), progressive ones (decoded whole)
    and PNGs (decoded by Pillow), of varied sizes."""
    size = (72 + (i * 37) % 120, 64 + (i * 53) % 130)
    if i % 7 == 3:
        return encode(photo(size, 500 + i), "JPEG", quality=90, progressive=True)
    if i % 11 == 5:
        return encode(photo(size, 500 + i), "PNG")
    return jpeg(size, seed=500 + i)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("augment")
    write_split(out, "train", UNEQUAL_SIZES, image)
    return out


def loader(folder: Path, world: World | None = None, **kw: Any) -> ShardLoader:
    options = {"batch_size": 4, "workers": 0, "seed": 3, "transform": TIMM} | kw
    return ShardLoader(folder, "train", world or World(), LoaderOptions(**options))


def epoch(ld: ShardLoader, e: int = 1) -> list[Batch]:
    ld.set_epoch(e)
    return list(ld)


def same(a: Iterable[Batch], b: Iterable[Batch]) -> bool:
    a, b = list(a), list(b)
    return len(a) == len(b) > 0 and all(
        torch.equal(x, y) and torch.equal(lx, ly) for (x, lx), (y, ly) in zip(a, b, strict=True))


def layout(ranks: int) -> list[World]:
    return [World(rank=r, world_size=ranks, local_rank=r, local_world_size=ranks, node_rank=0,
                  num_nodes=1) for r in range(ranks)]


def labels(batches: Iterable[Batch]) -> list[int]:
    return [int(x) for _, ls in batches for x in ls]


# -------------------------------------------------------------------------- the batches


def test_augmented_batches_are_the_same_for_0_1_and_2_workers(folder: Path) -> None:
    runs = [epoch(loader(folder, workers=w)) for w in (0, 1, 2)]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])
    plain = epoch(loader(folder, transform=PLAIN))
    assert labels(plain) == labels(runs[0])  # the same samples, boxes and flips first ...
    assert not same(plain, runs[0])  # ... then the ops


def test_a_mid_epoch_resume_gives_the_uninterrupted_runs_batches(folder: Path) -> None:
    whole = epoch(loader(folder))
    first = loader(folder)
    first.set_epoch(1)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    assert state["pixels"] == "imgprep-1+augment-1"
    again = loader(folder, workers=2)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert same(head + list(again), whole)


def test_an_elastic_resume_three_ranks_to_two_sees_each_sample_once_and_repeats(
        folder: Path) -> None:
    """Stop after 2 steps on 3 ranks; resume on 2 from rank 0's state, twice: the same
    augmented batches both times, and every sample of the epoch once."""
    seen: list[int] = []
    for w in layout(3):
        ld = loader(folder, w, tail="short")
        ld.set_epoch(1)
        seen += labels(b for _, b in zip(range(2), ld, strict=False))
    state = ld.state_dict()
    for w in layout(2):
        resumed = []
        for _ in range(2):
            ld = loader(folder, w, tail="short")
            ld.load_state_dict(state)
            resumed.append(list(ld))
        assert same(resumed[0], resumed[1])
        seen += labels(resumed[0])
    assert sorted(seen) == list(range(TOTAL))


def test_the_pillow_path_gives_the_same_batches_with_pillow_simd(folder: Path) -> None:
    if not pil_info(check_avx2=False).pillow_simd:
        pytest.skip("crop_decode=False decodes and resizes with the installed PIL, which is "
                    "not pillow-simd: its rows are not the extension's")
    for transform in (TIMM, TrainTransform(size=SIZE, augment=policy("ta_wide"))):
        ours = epoch(loader(folder, transform=transform))
        pillows = loader(folder, transform=transform, crop_decode=False)
        assert pillows.state_dict()["pixels"] == "pillow+augment-1"
        assert same(epoch(pillows), ours)


# ------------------------------------------------------------ every path, and Pillow's pixels


def rows(decoder: SampleDecoder | None, t: TrainTransform, data: bytes, seed: int
         ) -> np.ndarray:
    """The channels-last row of ``data`` (the decoder's; None: the Pillow path's)."""
    out = np.empty((t.size, t.size, 3), np.uint8)
    if decoder is None:
        apply(data, t, np.random.default_rng(seed), out, planar=False)
    else:
        decoder(data, np.random.default_rng(seed), out)
    return out


def photo_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        return img.size


def steps_of(t: TrainTransform, data: bytes, seed: int) -> tuple[Step, ...]:
    """The steps ``t`` draws for ``data``: after its crop box and flip, from the same
    generator (``TrainTransform.geometry``'s order)."""
    rng = np.random.default_rng(seed)
    crop_box(*photo_size(data), t, rng)
    rng.random()
    assert t.augment is not None
    return t.augment.steps(t.size, rng)


SAMPLES = {"region": jpeg((150, 110), seed=1), "whole": image(3), "pillow": image(5)}


@pytest.mark.parametrize("path", ["region", "whole", "pillow", "pillow-path"])
def test_every_decode_path_carries_the_ops_out_on_the_row_it_wrote(path: str) -> None:
    data = SAMPLES.get(path, SAMPLES["region"])
    t = TrainTransform(size=48, augment=policy("ta_wide", interpolation="bicubic"))
    plain = TrainTransform(size=48)
    made = {"region": "fast_count", "whole": "whole_count", "pillow": "pillow_count"}
    changed = 0
    for seed in range(40):
        dec = None if path == "pillow-path" else SampleDecoder(t, channels_last=True)
        got = rows(dec, t, data, seed)
        want = rows(None if dec is None else SampleDecoder(plain, channels_last=True),
                    plain, data, seed)
        changed += not np.array_equal(got, want)
        ops = t.geometry(*photo_size(data), np.random.default_rng(seed)).augment
        apply_ops(want, ops, planar=False)
        assert np.array_equal(got, want), seed
        if dec is not None:
            assert getattr(dec, made[path]) == 1
    assert changed > 20


def tv_spec(s: Step, size: int, look: dict[str, Any]) -> list[dict[str, Any]]:
    """torchvision 0.20.1 ``_apply_op`` on a PIL image, as the Pillow calls it makes:
    ``F.affine`` -> ``Image.transform`` with ``_get_inverse_affine_matrix``'s matrix
    (transcribed for these cases: shears about [0, 0], translations by ``int(m)``),
    ``F.rotate`` -> ``Image.rotate``, ``adjust_*`` -> ``ImageEnhance`` ..."""
    name, m = s.name, s.magnitude
    if name == "ShearX":
        sx = math.radians(math.degrees(math.atan(m)))
        return [{"op": "affine", "args": [1.0, math.tan(sx), 0.0, 0.0, 1.0, 0.0], **look}]
    if name == "ShearY":
        sy = math.radians(math.degrees(math.atan(m)))
        c = math.sin(-sy) / math.cos(sy)
        return [{"op": "affine", "args": [1.0, 0.0, 0.0, -c, 1.0, 0.0], **look}]
    if name in ("TranslateX", "TranslateY"):
        t = float(int(m))
        args = [1.0, 0.0, -t, 0.0, 1.0, 0.0] if name == "TranslateX" else \
            [1.0, 0.0, 0.0, 0.0, 1.0, -t]
        return [{"op": "affine", "args": args, **look}]
    if name == "Rotate":
        return [{"op": "rotate", "args": [m], **look}]
    enhance = {"Brightness": "brightness", "Color": "color", "Contrast": "contrast",
               "Sharpness": "sharpness"}
    if name in enhance:
        return [{"op": enhance[name], "args": [1.0 + m]}]
    if name in ("Posterize", "Solarize"):
        return [{"op": name.lower(), "args": [int(m) if name == "Posterize" else m]}]
    return [] if name == "Identity" else [{"op": name.lower()}]


def timm_spec(s: Step, size: int, look: dict[str, Any]) -> list[dict[str, Any]]:
    """timm v1.0.28 ``NAME_TO_OP``'s calls: ``img.transform`` with its literal matrices,
    ``img.rotate``, ``ImageEnhance``, ``ImageOps``, ``solarize_add``."""
    name, m = s.name.removesuffix("Increasing"), s.magnitude
    look = {**look, "resample": s.resample}
    matrices = {"ShearX": [1, m, 0, 0, 1, 0], "ShearY": [1, 0, 0, m, 1, 0],
                "TranslateXRel": [1, 0, m * size, 0, 1, 0],
                "TranslateYRel": [1, 0, 0, 0, 1, m * size]}
    if name in matrices:
        return [{"op": "affine", "args": matrices[name], **look}]
    if name == "Rotate":
        return [{"op": "rotate", "args": [m], **look}]
    if name == "Posterize":
        return [] if m >= 8 else [{"op": "posterize", "args": [int(m)]}]
    if name == "SolarizeAdd":
        return [{"op": "solarize_add", "args": [m, 128]}]
    if name in ("Solarize", "Color", "Contrast", "Brightness", "Sharpness"):
        return [{"op": name.lower(), "args": [m]}]
    return [{"op": name.lower()}]


REFERENCE = REPO / "build" / "pillow-reference" / "bin" / "python"
LOOKS = {  # name -> (policy, the spec maker, the look of its geometric ops)
    "ta_wide-nearest": (policy("ta_wide"), tv_spec, {"resample": "nearest", "fill": [0, 0, 0]}),
    "ta_wide-bicubic": (policy("ta_wide", interpolation="bicubic", fill=(9, 200, 31)), tv_spec,
                        {"resample": "bicubic", "fill": [9, 200, 31]}),
    "ra-bilinear": (policy("ra", interpolation="bilinear"), tv_spec,
                    {"resample": "bilinear", "fill": [0, 0, 0]}),
    "aa-imagenet": (policy("aa-imagenet"), tv_spec, {"resample": "nearest", "fill": [0, 0, 0]}),
    "rand-m9-mstd0.5-inc1": (policy("rand-m9-mstd0.5-inc1"), timm_spec,
                             {"fill": [124, 116, 104]}),
    "rand-m7-n4-mstd101": (policy("rand-m7-n4-mstd101"), timm_spec, {"fill": [124, 116, 104]}),
}


@pytest.mark.slow
def test_the_augmented_rows_are_stock_pillows_calls_on_the_resampled_crop(
        tmp_path: Path) -> None:
    """Rows made here (pillow-simd's environment) equal, byte for byte, stock Pillow 13's
    own calls (``tests/support/pillow_reference.py`` in ``build/pillow-reference``) on the
    same rows unaugmented, with the steps the policy drew: the published ops' pixels."""
    if not REFERENCE.exists():
        pytest.skip(f"{REFERENCE} is absent: make setup builds the stock-Pillow environment")
    datas = [image(i) for i in range(24)]
    for name, (pol, spec, look) in LOOKS.items():
        t, plain = TrainTransform(size=48, augment=pol), TrainTransform(size=48)
        ours = SampleDecoder(t, channels_last=True)
        theirs = SampleDecoder(plain, channels_last=True)
        crops, chains, want = [], [], []
        for i, data in enumerate(datas):
            seed = 1000 * i + len(name)
            crops.append(rows(theirs, plain, data, seed))
            want.append(rows(ours, t, data, seed))
            chains.append([x for s in steps_of(t, data, seed) for x in spec(s, 48, look)])
        got = reference(tmp_path / name, np.stack(crops), chains)
        for i, w in enumerate(want):
            assert bytes(got[i, i]) == bytes(digest(w)), (name, i, chains[i])


def reference(where: Path, crops: np.ndarray, chains: list[list[dict[str, Any]]]) -> np.ndarray:
    """Each chain on each crop in the stock-Pillow environment: the digests, chains x crops."""
    where.mkdir()
    np.savez(where / "in.npz", crops=crops, specs=np.array(json.dumps(chains)))
    done = subprocess.run([str(REFERENCE), str(REPO / "tests/support/pillow_reference.py"),
                           str(where / "in.npz"), str(where / "out.npz")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(where / "out.npz") as out:
        assert str(out["version"]) == "13.0.0"
        return out["digests"]


# ------------------------------------------------------------------ versions and refusals


def test_the_pixel_version_names_the_augmentation_and_a_resume_across_it_is_refused(
        folder: Path) -> None:
    aug, plain = loader(folder), loader(folder, transform=PLAIN)
    for ld in (aug, plain):
        ld.set_epoch(1)
        next(iter(ld))
    state, plain_state = aug.state_dict(), plain.state_dict()
    assert (state["pixels"], plain_state["pixels"]) == ("imgprep-1+augment-1", "imgprep-1")
    with pytest.raises(LoaderError, match=r"pixel version 'imgprep-1\+augment-1'.*'imgprep-1'"):
        loader(folder, transform=PLAIN).load_state_dict(state)
    with pytest.raises(LoaderError, match=r"pixel version 'imgprep-1', this loader's are "
                                          r"'imgprep-1\+augment-1'"):
        loader(folder).load_state_dict(plain_state)
    loader(folder, transform=TrainTransform(size=SIZE, augment=policy("ta_wide"))
           ).load_state_dict(state)  # another policy of the same version resumes
    loader(folder).load_state_dict({k: v for k, v in plain_state.items() if k != "pixels"})


@pytest.mark.parametrize("backend", ["dali", "nvjpeg"])
def test_the_gpu_backends_refuse_a_policy_naming_themselves(backend: str) -> None:
    with pytest.raises(ValueError, match=rf"backend='{backend}' does not carry out "
                                         r"augmentation policies \(transform.augment "
                                         r"'rand-m9-mstd0.5-inc1'\).*backend='pillow'"):
        LoaderOptions(batch_size=2, backend=backend, device="gpu", transform=TIMM)
    LoaderOptions(batch_size=2, backend=backend, transform=PLAIN)  # without one: as before


def test_a_build_without_the_extension_refuses_a_policy_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loaders.config.AUGMENT_BUILT", False)
    with pytest.raises(ValueError, match="runs in imgprep's C extension, which is") as e:
        LoaderOptions(batch_size=2, transform=TIMM)
    assert "\n" not in str(e.value)
    LoaderOptions(batch_size=2, transform=PLAIN)


def test_an_augmented_epoch_gives_the_pinned_bytes(folder: Path) -> None:
    """The bytes of one augmented epoch, pinned: a change to the draws or the ops must come
    with a new AUGMENT_VERSION (loaders.augment)."""
    inputs = hashlib.sha256(b"".join(image(i) for i in range(TOTAL))).hexdigest()
    if inputs != INPUTS:
        pytest.skip(f"this PIL encodes the fixture's images as other bytes (sha256 {inputs})")
    h = hashlib.sha256()
    for images, ls in epoch(loader(folder)):
        h.update(images.numpy().tobytes())
        h.update(ls.numpy().astype("<i8").tobytes())
    assert h.hexdigest() == PINNED


INPUTS = "9b40436c86d5199666543ce35ecd8edb6521f2336e83f3c0a416f78d1e2dc4bc"
PINNED = "f1d093bbf3c6687014665cb73cec742f525f432bb21ea6d120af968eb0c5ceb7"
