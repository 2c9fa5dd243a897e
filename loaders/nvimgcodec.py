"""The ``nvimgcodec`` backend: the nvjpeg backend's batches, decoded by the GPU's hardware JPEG
decoders (NVJPG: A100, H100, H200 and others carry them) through NVIDIA nvImageCodec, a share
of each batch on the CPU beside them.

- Everything but the GPU decoder is the nvjpeg backend's (``loaders.nvjpeg``, of which this
  is a subclass): what is read (the plan's samples), the boxes and flips (the Pillow backend's
  draws, ``loaders.batchcrop.boxes``) and the batched crop on the device, the CPU decode
  (Pillow) and its rules (what is not a whole Huffman-coded JPEG of 1 or 3 components goes
  to the CPU; a sample the GPU decoder refuses is decoded there), the errors, the thread
  that makes batches ahead and the pool of ``workers`` CPU-decode threads.
- Decoding, with ``device="gpu"``: an nvImageCodec ``Decoder`` on GPU ``local_rank`` allowed
  one backend, the hardware engines (``BackendKind.HW_GPU_ONLY``), which use none of the
  GPU's SMs: the model's kernels keep them (torchvision's nvJPEG decodes on the SMs, in the
  model's way). Of each batch, ``hw_load`` (``LoaderOptions.hw_decoder_load``, the share DALI
  calls ``hw_decoder_load``; default ``HW_LOAD``) goes to the engines, the first such
  samples, and the rest to the CPU threads, decoding beside them. Images come back RGB
  (grey ones too), in the rank's current CUDA stream, without EXIF rotation (as Pillow's
  decode); what the engines refuse (None: a GPU without them, a JPEG they do not take) is
  decoded on the CPU. A batch of which they decoded nothing is said once, in a warning.
- ``device="cpu"`` (the backend's CPU form, and tests): every sample on the CPU, the rest of
  the batch on the CPU too; nvImageCodec is needed only for ``"gpu"``, and imported then:
  ``pip install nvidia-nvimgcodec-cu13`` (``-cu12`` for a CUDA 12 torch).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from loaders.backends import EncodedSample, Source
from loaders.config import Config
from loaders.errors import LoaderError
from loaders.nvjpeg import Decoder, NvjpegBackend, on_device
from loaders.transforms import SampleError

logger = logging.getLogger(__name__)
HW_LOAD = 0.65  # of each batch to the hardware decoders by default (DALI's hw_decoder_load)
PACKAGE = "nvidia-nvimgcodec-cu13"  # -cu12 for a CUDA 12 build of torch


def load_nvimgcodec(rank: int, device: torch.device) -> Decoder:
    """nvImageCodec's hardware-only decoder on ``device`` (made at its first call, in the
    thread that decodes); a ``LoaderError`` saying what to install when it cannot be
    imported."""
    try:
        import nvidia.nvimgcodec as nvimgcodec
    except (ImportError, OSError, RuntimeError) as e:  # absent, or its libraries do not load
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise LoaderError(
            f"rank {rank}: backend='nvimgcodec' with device='gpu' decodes with NVIDIA "
            f"nvImageCodec, which cannot be imported ({reason}); install it with pip install "
            f"{PACKAGE} ({PACKAGE.replace('cu13', 'cu12')} for a CUDA 12 torch), or load with "
            "device='cpu'") from None
    made: list[Any] = []
    params = nvimgcodec.DecodeParams(apply_exif_orientation=False,
                                     color_spec=nvimgcodec.ColorSpec.RGB, allow_any_depth=False)

    def decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
        if not made:
            made.append(nvimgcodec.Decoder(device_id=device.index or 0, backends=[
                nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)]))
        stream = torch.cuda.current_stream(device).cuda_stream
        images = made[0].decode([nvimgcodec.CodeStream(d.numpy()) for d in datas],
                                params=params, cuda_stream=stream)
        return [None if im is None else torch.as_tensor(im, device=device).permute(2, 0, 1)
                for im in images]

    return decode


class NvimgcodecBackend(NvjpegBackend):
    """The ``nvimgcodec`` backend (module docstring)."""

    def __init__(self, cfg: Config, source: Source) -> None:
        super().__init__(cfg, source)
        load = cfg.options.hw_decoder_load
        self.share = HW_LOAD if load is None else load
        self._said = False  # the warning of a batch the engines decoded none of

    def _gpu_decoder(self) -> Decoder | None:
        if self.device.type != "cuda":
            return None
        return load_nvimgcodec(self.cfg.world.rank, self.device)

    def _decode(self, items: list[EncodedSample]) -> list[torch.Tensor | SampleError]:
        before = self.cpu_decoded
        decoded = super()._decode(items)
        given = min(round(self.share * len(items)), sum(on_device(s.data) for s in items))
        if self._nvjpeg is not None and given and not self._said \
                and self.cpu_decoded - before == len(items):
            self._said = True
            logger.warning("rank %d: the GPU's hardware JPEG decoders decoded none of the %d "
                           "samples of a batch they were given; they are decoded on the CPU "
                           "(does this GPU have NVJPG engines? A100, H100 and H200 do)",
                           self.cfg.world.rank, given)
        return decoded
