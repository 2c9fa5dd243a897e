"""The per-image budget, measured: the worst hostile files (20,000 scans; headers declaring
tens of millions of pixels in a few hundred bytes) are refused within 2 s of CPU and under
300 MB of peak memory above the process's own, in convert and in a loader worker's decode,
each alone in a process (CPU by getrusage, not wall time: it holds on a busy machine); a
12 MP progressive photo and a 1 x 20,000 strip still decode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.convert.test_untrusted import LEGAL, header_only, many_scans
from tests.support import REPO

pytestmark = pytest.mark.serial  # peak memory and CPU of children, measured alone
HOSTILE = {
    "20,000 scans": lambda: many_scans(20000),
    "9400x9400 progressive header": lambda: header_only(9400, 9400),
    "9000x9000 CMYK header": lambda: header_only(9000, 9000, "CMYK"),
}
MODES = ["convert", "loader-train", "loader-val"]


def cost(tmp_path: Path, data: bytes, mode: str) -> dict[str, object]:
    path = tmp_path / "image"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "tests.support.bounds_child", str(path), mode],
                          cwd=REPO, capture_output=True, text=True, timeout=240, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_files_are_refused_within_2_s_of_cpu_and_300_mb(tmp_path: Path, name: str,
                                                                mode: str) -> None:
    c = cost(tmp_path, HOSTILE[name](), mode)
    assert c["outcome"] != "ok" and "refused" in str(c["outcome"]), c
    assert float(str(c["cpu_s"])) < 2.0 and float(str(c["rss_mb"])) < 300, c


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["12 MP progressive", "1 x 20,000 strip"])
def test_large_legal_images_still_decode_in_a_process_of_their_own(tmp_path: Path, name: str,
                                                                   mode: str) -> None:
    c = cost(tmp_path, LEGAL[name](), mode)
    assert c["outcome"] == "ok", c
