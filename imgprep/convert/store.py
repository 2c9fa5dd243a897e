"""Which member holds a sample's image (``--store``): the converted JPEG as ``.jpg``, or its
full-scale decode as stored pixels (``imgprep.rawformat``: ``.yuv420``, ``.rgb24``).

The choice is a pure function of the store options, the sample's key and its JPEG's bytes,
so it is the same for every worker count and rank layout, in ``convert`` as in
``convert --from-shards`` (``imgprep.convert.fromshards``):

- ``yuv420`` or ``rgb``: every image stored as pixels;
- ``mixed`` with ``fraction``: the images whose key hashes below ``fraction`` (FFCV's
  proportion, without its randomness: a rerun picks the same images);
- ``mixed`` with ``min_ratio``: the images whose JPEG is at least ``min_ratio`` of the
  stored pixels' bytes. Decoding a JPEG costs about in proportion to its bytes (entropy
  decoding) and pixels; storing its pixels costs the difference in bytes. The images with the
  largest JPEGs for their pixels are where a decode costs most and storing costs least.
"""

from __future__ import annotations

import hashlib

from imgprep import jpegcrop, rawpixels
from imgprep.errors import ImageError
from imgprep.rawformat import Kind, record_size
from imgprep.sections import StoreOptions

JPEG_EXT = "jpg"


def unit_hash(key: str) -> float:
    """A number in [0, 1) made from ``key`` alone (the proportion rule's draw)."""
    digest = hashlib.sha256(f"imgprep-store:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0 ** 64


def stored_kind(store: StoreOptions, key: str, jpeg: bytes) -> Kind | None:
    """The kind of stored pixels sample ``key`` keeps, or None to keep ``jpeg``."""
    if not store.stored:
        return None
    kind = rawpixels.kind_of(store.raw)
    if store.fraction is not None:
        return kind if unit_hash(key) < store.fraction else None
    if store.min_ratio is not None:
        head = jpegcrop.probe(jpeg)
        if head.width <= 0:
            raise ImageError("cannot read the JPEG's header to weigh it against its pixels")
        raw = record_size(kind, head.width, head.height)
        return kind if len(jpeg) >= store.min_ratio * raw else None
    return kind


def image_member(store: StoreOptions, key: str, jpeg: bytes, max_pixels: int = 0
                 ) -> tuple[str, bytes]:
    """The extension and bytes of the member that holds sample ``key``'s image; ImageError
    when its pixels cannot be stored."""
    kind = stored_kind(store, key, jpeg)
    if kind is None:
        return JPEG_EXT, jpeg
    data, made = rawpixels.record(jpeg, kind, max_pixels)
    return made.ext, data


def check_available(store: StoreOptions) -> None:
    """Refuse a store of pixels where the extension is not built (before any work)."""
    if store.stored:
        rawpixels.require()
