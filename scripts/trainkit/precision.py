"""Whether forward and backward run under bf16 autocast: ``--bf16 auto`` (the default) turns it
on only where the device runs bf16 natively, since emulated bf16 is many times slower than fp32.

Native bf16: a CUDA GPU for which ``torch.cuda.is_bf16_supported()``; an x86 CPU whose
``/proc/cpuinfo`` flags include AMX (``amx_bf16``) or AVX-512 BF16 (``avx512_bf16``). The
decision is a pure function of the mode, the device type and those facts (``choose``), so it is
tested without the hardware; ``detect`` gathers the facts on this machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("auto", "on", "off")
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags for native bf16 matrix arithmetic


@dataclass(frozen=True)
class Precision:
    """The choice (``bf16``: autocast on), the ``--bf16`` mode it came from, and why."""

    bf16: bool
    mode: str
    why: str

    @property
    def name(self) -> str:
        return "bf16 autocast" if self.bf16 else "fp32"

    def line(self) -> str:
        """The line the trainer prints first: ``precision: fp32 (--bf16 auto: ...)``."""
        return f"precision: {self.name} (--bf16 {self.mode}: {self.why})"

    def record(self) -> dict[str, Any]:
        """The same for ``--log-json`` and the summary."""
        return {"bf16": self.bf16, "mode": self.mode, "why": self.why}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor listed in ``/proc/cpuinfo``'s text (x86 ``flags``)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_cpu_bf16(flags: Iterable[str]) -> str | None:
    """The first flag in ``flags`` that says the CPU computes bf16 natively, else None."""
    have = set(flags)
    return next((f for f in BF16_CPU_FLAGS if f in have), None)


def choose(mode: str, device: str, *, cuda_bf16: bool = False,
           flags: Iterable[str] = ()) -> Precision:
    """bf16 autocast or fp32 for ``mode`` (auto, on, off) on a ``device`` type ("cuda",
    "cpu"): ``cuda_bf16`` is ``torch.cuda.is_bf16_supported()`` there, ``flags`` the CPU's."""
    if mode not in MODES:
        raise ValueError(f"--bf16 must be one of {', '.join(MODES)}, not {mode!r}")
    if device == "cuda":
        native = cuda_bf16
        what = "this GPU " + ("supports bf16" if native else "does not support bf16")
    elif device == "cpu":
        flag = native_cpu_bf16(flags)
        native = flag is not None
        what = f"this CPU reports {flag}" if flag else \
            f"this CPU reports neither {' nor '.join(BF16_CPU_FLAGS)}, so bf16 would run emulated"
    else:
        native, what = False, f"no native bf16 known on {device}"
    if mode == "on":
        return Precision(True, mode, "forced" if native else
                         f"forced, although {what}, slower than fp32")
    if mode == "off":
        return Precision(False, mode, f"forced, although {what}" if native else "forced")
    return Precision(native, mode, f"{what}; --bf16 " + ("off forces fp32" if native else
                                                         "on forces bf16"))


def detect(mode: str, device: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> Precision:
    """``choose`` with this machine's facts (an unreadable cpuinfo means no flags)."""
    cuda_bf16 = False
    if device == "cuda":
        import torch

        cuda_bf16 = bool(torch.cuda.is_bf16_supported())
    try:
        flags = cpu_flags(cpuinfo.read_text()) if device == "cpu" else frozenset()
    except OSError:
        flags = frozenset()
    return choose(mode, device, cuda_bf16=cuda_bf16, flags=flags)
