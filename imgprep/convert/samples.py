"""What one converted image becomes in the output: its shard members (``.jpg``, or the
stored pixels ``--store`` asks for: ``imgprep.convert.store``; ``.cls``, ``.json``), or its
path under the output root and its line in the label list.

A split converted without labels (the test split: ``Plan.labelled`` is False) gets no ``.cls``
member, no ``label`` or ``wnid`` in its ``.json``, images under ``<split>/`` directly, and list
lines that hold the path alone: no made-up label (the loaders' padding label -1 included) is
ever written for it.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as _js
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imgprep.convert.converted import Converted
    from imgprep.convert.tasks import Plan


def sample_meta(plan: Plan, i: int, conv: Converted) -> bytes:
    """The sample's ``.json``: ``json.dumps(..., sort_keys=True)``'s bytes, built directly."""
    w, h = conv.original_size
    text = (f'"original_format": {_js(conv.original_format)}, '
            f'"original_mode": {_js(conv.original_mode)}, "original_size": [{w}, {h}], '
            f'"source": {_js(plan.listing.member_str(i))}')
    if not plan.labelled:
        return f"{{{text}}}".encode()
    label = int(plan.labels[i])
    return f'{{"label": {label}, {text}, "wnid": {_js(plan.classes.wnids[label])}}}'.encode()


def shard_members(plan: Plan, i: int, conv: Converted) -> dict[str, bytes]:
    """The members of listing item ``i``'s sample, by extension, in the order written."""
    ext, image = conv.image or ("jpg", conv.jpeg)  # stored pixels: imgprep.convert.store
    fields = {ext: image}
    if plan.labelled:
        fields["cls"] = b"%d" % int(plan.labels[i])
    if plan.opts.meta:
        fields["json"] = sample_meta(plan, i, conv)
    return fields


def list_path(plan: Plan, i: int) -> str:
    """Where a label list's image of listing item ``i`` goes, relative to the output root:
    ``<split>/<wnid>/<key>.jpg`` (``<split>/<key>.jpg`` without labels)."""
    folder = f"{plan.classes.wnids[int(plan.labels[i])]}/" if plan.labelled else ""
    return f"{plan.split}/{folder}{plan.listing.key_str(i)}.jpg"


def list_line(rel: str, label: int | None) -> str:
    """A label list's line: ``path label``, or the path alone in an unlabelled split (label
    None)."""
    return f"{rel}\n" if label is None else f"{rel} {label}\n"
