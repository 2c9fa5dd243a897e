"""An untrusted image opened for Pillow to decode, the same way in convert and in the
loaders: one list of accepted formats (``ACCEPTED_FORMATS``, opened by that list alone, so no
other Pillow plugin ever sees the bytes), the per-image budget checked before a pixel is
decoded (``imgprep.budget``), a JPEG's damage judged by one rule (``jpeg_scan``:
``jpegcrop.Scan.damage``), and every failure of Pillow's decoders an ``ImageError``
(``decoding``).

What the extension decodes itself (JPEGs libjpeg-turbo makes RGB of) never comes here: its
budget and damage rules are applied inside it, to the same numbers.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import replace

from PIL import Image, UnidentifiedImageError, features

from imgprep import budget, jpegcrop
from imgprep.errors import ImageError

# MPO (multi-picture JPEG) has no opener of its own: the JPEG opener returns it.
ACCEPTED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")
JPEG_MAGIC = b"\xff\xd8\xff"
# Formats Pillow can read that are refused, by their first bytes: named in the refusal.
_REFUSED_MAGIC = (
    (b"qoif", "QOI"), (b"DDS ", "DDS"), (b"%!PS", "PostScript (EPS)"),
    (b"\xc5\xd0\xd3\xc6", "PostScript (EPS)"), (b"\x00\x00\x01\x00", "ICO"),
    (b"\x01\xda", "SGI"), (b"\x0a\x05", "PCX"), (b"icns", "ICNS"), (b"8BPS", "PSD"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xffO\xffQ", "JPEG 2000"),
)
_NETPBM = (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6", b"P7", b"Pf", b"PF")


def what_it_is(data: bytes) -> str:
    """Why Pillow found no accepted image in ``data``, in words that name what it is."""
    head = data[:64].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "an HTML page (no image format recognised)"
    if data.startswith(JPEG_MAGIC):
        layout = budget.prescan(data)
        return budget.unreadable(layout) or "a JPEG whose headers cannot be read"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        if not features.check("webp"):
            return ("a WebP image, but this Pillow is built without WebP support (stock "
                    "Pillow's wheels have it; pillow-simd needs libwebp-dev when it is built)")
        return "a WebP image that cannot be read"
    if data[:2] in _NETPBM and data[2:3].isspace():
        return _refused_format("Netpbm (PPM, PGM, PBM, PFM)")
    if data[4:8] == b"ftyp":
        return _refused_format("ISO media (HEIF, AVIF)")
    name = next((n for magic, n in _REFUSED_MAGIC if data.startswith(magic)), None)
    return _refused_format(name) if name else "not an image (no image format recognised)"


def _refused_format(name: str) -> str:
    return (f"a {name} image, a format that is not read (accepted: "
            f"{', '.join(ACCEPTED_FORMATS)})")


def identify(data: bytes) -> Image.Image:
    """``data`` opened as one of ``ACCEPTED_FORMATS``, its header read and nothing decoded;
    ImageError naming what it is otherwise (a decompression bomb's is caused by Pillow's
    ``DecompressionBombError``)."""
    if not data:
        raise ImageError("empty file (0 bytes)")
    try:
        return Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError as e:
        raise ImageError(what_it_is(data)) from e
    except Image.DecompressionBombError as e:
        raise ImageError(f"decompression bomb refused: {e}") from e
    except Exception as e:  # noqa: BLE001  any failure of a header parser on untrusted bytes
        raise ImageError(f"unreadable image header: {e or type(e).__name__}") from e


def jpeg_scan(data: bytes, fmt: str = "JPEG") -> jpegcrop.Scan:
    """What reading the JPEG ``data`` to its end finds, held to the budget: the extension's
    read of every scan (``jpegcrop.check``), or where it is not built what ``budget.prescan``
    shows (the budget, the end-of-image marker and what follows it). An MPO's trailing bytes
    are its other pictures."""
    if jpegcrop.AVAILABLE:
        scan = jpegcrop.check(data)
    else:
        layout = budget.prescan(data)
        why = budget.unreadable(layout) or budget.refusal(layout, len(data))
        end = layout.end
        scan = jpegcrop.Scan(error=why, refused=True) if why else jpegcrop.Scan(
            eof=end is None, trailing=0 if end is None else len(data) - end)
    return of_format(scan, fmt)


def of_format(scan: jpegcrop.Scan, fmt: str) -> jpegcrop.Scan:
    """What reading a JPEG's data found, as damage counts it for ``fmt``: an MPO's trailing
    bytes are its other pictures."""
    return replace(scan, trailing=0) if fmt == "MPO" else scan


def check_budget(img: Image.Image, data: bytes) -> jpegcrop.Scan | None:
    """Hold the opened ``img`` (of ``data``) to its budget and, for a JPEG, to the damage
    rule: ImageError with the reason; a JPEG's scan (its notes, for the warnings log)."""
    fmt = img.format or "?"
    if fmt in ("JPEG", "MPO"):
        scan = jpeg_scan(data, fmt)
        if (damage := scan.damage()) is not None:
            raise ImageError(damage)
        return scan
    why = budget.other_refusal(img.width, img.height, len(data), fmt)
    if why is not None:
        raise ImageError(f"refused: {why}")
    return None


@contextlib.contextmanager
def decoding(img: Image.Image) -> Iterator[None]:
    """Any failure of Pillow's decoders on ``img`` as an ImageError naming its format, mode
    and size: a decoder that meets hostile bytes may raise anything (IndexError, struct's
    error, NotImplementedError ...)."""
    fmt, mode, (w, h) = img.format or "?", img.mode, img.size
    try:
        yield
    except ImageError:
        raise
    except Exception as e:  # noqa: BLE001  every decoder failure is the image's, never the run's
        reason = str(e) or type(e).__name__
        if "truncated" in reason or isinstance(e, EOFError):
            reason = f"truncated image data ({reason})"
        raise ImageError(f"cannot decode {fmt} {mode} {w}x{h}: {reason}") from e
