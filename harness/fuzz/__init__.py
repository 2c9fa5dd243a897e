"""Fuzzing the C that parses untrusted bytes: real JPEGs mutated the ways files break
(``mutate``), fed to a target callable by one runner (``run``) that counts outcomes and
keeps every input that broke a property; the crop-aware decoder's target (``extension``: no
crash, and either the full decode's pixels or a clean decline), convert's C path's
(``convert``: decode, resample and encode, the region decode's answer equal to the whole
decode's, every output a JPEG of the size reported), the loader's one call a sample
(``sample``: a region's row equal to the whole decode's), stored pixels' (``rawsample``: a
record made of each input, kept or damaged, carried to a row as the JPEG path carries the
JPEG, or refused before a pixel is read), the augmentation ops' (``augment``: random op
lists, legal or just past a limit, alike by kernel and layout, or refused untouched), each
input to one of them, and their sanitizer build, loaded with libasan preloaded in a child
process (``sanitize``). The seeds (``seeds``) add unusual chroma samplings and progressions
of up to 190 scans (``progressive``), and every call into the extension is held to a
CPU-time bound that the per-image budget must keep (``target.bounded``). A new piece of C
joins by writing a target: a callable ``(data, rng) -> outcome`` that raises ``Mismatch``
when a property fails.

    python -m harness.fuzz.sanitize --inputs 200000      # ASan + UBSan, the sample's JPEGs
    python -m harness.fuzz.run --inputs 20000             # the normal build, in this process
    python -m harness.fuzz.run --target raw               # one of jpegcrop, convert, sample,
                                                          # raw (stored pixels) or augment
"""
