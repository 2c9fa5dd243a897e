"""What the kit writes: each check's rows (a measure, its value, a target and the verdict),
the JSON record of the whole run and the markdown table made from it.

The record is one file, ``<out>/gpu_check.json``, rewritten (atomically) as each check
finishes, with the table beside it (``gpu_check.md``): a run stopped part way keeps what it
measured, and a machine that returns few files returns both. A row's ``result`` is ``PASS``
or ``SHORT`` for a target that applies here, ``FAIL`` for an equality that did not hold,
``info`` for a target that applies only on the full GPU run, and empty for a plain figure.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import verdict
from imgprep import write_bytes_atomic

JSON_NAME, MARKDOWN_NAME = "gpu_check.json", "gpu_check.md"
BAD = ("SHORT", "FAIL")


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the table."""

    check: str
    measure: str
    value: str
    target: str = ""
    result: str = ""


def figure(check: str, measure: str, value: float | str, digits: int = 1) -> Row:
    """A plain figure (no target), numbers with thousands separators."""
    text = value if isinstance(value, str) else f"{value:,.{digits}f}"
    return Row(check=check, measure=measure, value=text)


def ratio(check: str, measure: str, value: float, target: float, applies: bool) -> Row:
    """A ratio held to ``>= target``: judged where ``applies``, else reported as ``info``."""
    result = verdict(value, target) if applies else "info"
    return Row(check=check, measure=measure, value=f"{value:.3f}", target=f">= {target}",
               result=result)


def below(check: str, measure: str, value: float, target: float, applies: bool,
          unit: str = "") -> Row:
    """A figure held to ``< target`` (a projection in minutes), judged where ``applies``."""
    result = verdict(value, target, below=True) if applies else "info"
    return Row(check=check, measure=measure, value=f"{value:.2f}{unit}",
               target=f"< {target}{unit}", result=result)


def holds(check: str, measure: str, ok: bool, detail: str) -> Row:
    """An equality or a property that must hold on every machine: PASS or FAIL."""
    return Row(check=check, measure=measure, value=detail, target="holds",
               result="PASS" if ok else "FAIL")


@dataclass(eq=False)
class Record:
    """The run's record: the machine, the skipped checks, each finished check; written to
    ``out`` (when given) every time it changes."""

    out: Path | None
    kit: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, name: str, result: dict[str, Any]) -> None:
        """A finished check: its rows (``Row``) and figures, or its ``error``."""
        rows = [asdict(r) for r in result.pop("rows", [])]
        self.checks[name] = {"rows": rows, **result}
        self.write()

    def rows(self) -> list[Row]:
        return [Row(**r) for c in self.checks.values() for r in c["rows"]]

    @property
    def failed(self) -> list[str]:
        """The checks that raised, or have a row SHORT of its target or FAILed."""
        return [name for name, c in self.checks.items()
                if "error" in c or any(r["result"] in BAD for r in c["rows"])]

    def as_json(self) -> dict[str, Any]:
        return {"kit": self.kit, "machine": self.machine, "skipped": self.skipped,
                "checks": self.checks, "failed": self.failed,
                "all_pass": not self.failed and bool(self.checks)}

    def write(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.out / JSON_NAME,
                           (json.dumps(self.as_json(), indent=1, sort_keys=True) + "\n").encode())
        write_bytes_atomic(self.out / MARKDOWN_NAME, markdown(self).encode())


def machine_line(machine: dict[str, Any]) -> str:
    """One sentence: the GPU (or none), torch and CUDA, PIL, the crop-aware decoder, cores."""
    gpu = machine.get("gpu")
    where = (f"{gpu['name']} ({gpu['memory_gib']:.1f} GiB)" if gpu else "no GPU (CPU form)")
    pil = machine.get("pil", {})
    flavour = "pillow-simd" if pil.get("pillow_simd") else "stock Pillow"
    wheel = " (imgprep from a wheel)" if machine.get("imgprep", {}).get("wheel") else ""
    return (f"{where}; torch {machine.get('torch')} (CUDA {machine.get('cuda') or 'none'}); "
            f"Python {machine.get('python')}; PIL {pil.get('pil_version')} ({flavour}); "
            f"crop-aware decoder {pil.get('crop_decode')}{wheel}; {machine.get('cores')} cores")


def cell(text: str) -> str:
    """A table cell: pipes escaped, one line."""
    return " ".join(text.replace("|", "\\|").split())


def plural(n: int, word: str) -> str:
    """``1 worker``, ``15 workers``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def markdown(record: Record) -> str:
    """The table ready to paste into docs/benchmarks.md, with the command and the machine."""
    kit = record.kit
    lines = [f"### GPU acceptance, {kit.get('form')} ({kit.get('date')})", "",
             f"    {kit.get('command')}", "",
             f"On {machine_line(record.machine)}; load average {kit.get('loadavg_start')} "
             f"-> {kit.get('loadavg_end', '...')}.", "",
             "| check | measure | value | target | result |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cell(v) for v in (r.check, r.measure, r.value, r.target,
                                                   r.result)) + " |" for r in record.rows()]
    for name, c in record.checks.items():
        if "error" in c:
            lines.append(f"| {name} | error | {cell(c['error'][:300])} | | FAIL |")
    if record.skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in record.skipped.items())
                  + "."]
    return "\n".join(lines) + "\n"


def today() -> str:
    return time.strftime("%Y-%m-%d")
