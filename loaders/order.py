"""Epoch orders: which position of a pool the k-th position of epoch e's order is.

An order is a permutation of a pool's positions ``0 .. n-1``, keyed by (seed, epoch, pool).
Two versions exist, and a loader's state records which one it ran (``ORDER_KEY``), because
resuming an epoch exactly needs the same order:

- **Version 1**: ``np.random.default_rng([seed, epoch, 0x5A3, pool]).permutation(n)``. Every
  rank draws the whole pool-sized permutation to look up its own positions (about 1 s and
  100 MB a rank an epoch at 13 M samples), and numpy does not promise ``permutation`` stable
  across releases. Kept exactly, for resuming checkpoints written with it
  (``tests/loaders/test_order.py`` pins it).
- **Version 2** (the default): a keyed bijection evaluated only at the positions a rank needs,
  so a rank's cost is its share of the epoch. A balanced Feistel network of ``ROUNDS``
  rounds over the smallest power-of-4 domain ``4**h >= n`` (two ``h``-bit halves), its round
  function a 64-bit integer mixer (splitmix64's finaliser) of the right half and a round key;
  values that land at or past ``n`` walk the cycle (apply the network again) until they are
  inside ``[0, n)``, which keeps it a bijection on ``[0, n)``; as ``4**h < 4n``, fewer than
  four steps are expected. The round keys come from BLAKE2b of the text
  ``"order-v2:<seed>:<epoch>:<pool>"``; everything is unsigned 64-bit integer arithmetic
  (wrapping multiplication), so the order is the same on every numpy version and platform.
"""

from __future__ import annotations

import hashlib

import numpy as np

ORDER_VERSIONS = (1, 2)
ORDER_VERSION = 2  # what new loaders use
ORDER_KEY = "order_version"  # the state_dict key that records it (absent: version 1)
ROUNDS = 6  # Feistel rounds of version 2 (4 make a pseudo-random permutation; 2 spare)

_U = np.uint64
_M1, _M2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)  # splitmix64's multipliers


def check_order_version(version: object) -> int:
    """``version`` as an order version, or a ValueError naming the ones there are."""
    if isinstance(version, bool) or version not in ORDER_VERSIONS:
        raise ValueError(f"order_version must be one of {ORDER_VERSIONS}, not {version!r}")
    return int(version)


def permutation_v1(n: int, seed: int, epoch: int, pool: int) -> np.ndarray:
    """Version 1's whole order of a pool of ``n`` samples (pool-sized)."""
    return np.random.default_rng([seed, epoch, 0x5A3, pool]).permutation(n)


def round_keys(seed: int, epoch: int, pool: int) -> tuple[np.uint64, ...]:
    """Version 2's round keys for (seed, epoch, pool): 64 bits each, from BLAKE2b."""
    text = f"order-v2:{int(seed)}:{int(epoch)}:{int(pool)}".encode()
    digest = hashlib.blake2b(text, digest_size=8 * ROUNDS).digest()
    return tuple(_U(int.from_bytes(digest[8 * i:8 * i + 8], "little")) for i in range(ROUNDS))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array (a bijection of 64-bit words)."""
    x ^= x >> _U(30)
    x *= _M1
    x ^= x >> _U(27)
    x *= _M2
    x ^= x >> _U(31)
    return x


def _network(x: np.ndarray, half: int, keys: tuple[np.uint64, ...]) -> np.ndarray:
    """The Feistel network on values of ``2 * half`` bits (a uint64 array, not changed)."""
    low, shift = _U((1 << half) - 1), _U(half)
    top = _U(64 - half)  # the round function's output: the mixer's top ``half`` bits
    left, right = x >> shift, x & low
    for k in keys:
        f = _mix(right ^ k) >> top
        left, right = right, left ^ f
    return (left << shift) | right


def feistel(positions: np.ndarray, n: int, keys: tuple[np.uint64, ...]) -> np.ndarray:
    """Version 2's bijection of ``[0, n)`` at ``positions`` (each in ``[0, n)``), as int64."""
    pos = np.asarray(positions, dtype=np.int64)
    if n <= 1:
        return pos.copy()
    half = max(1, (int(n - 1).bit_length() + 1) // 2)  # 4**half >= n
    out = _network(pos.astype(np.uint64), half, keys)
    walk = np.flatnonzero(out >= _U(n))
    while walk.size:  # cycle-walking: ends, as each value's cycle holds its start (< n)
        out[walk] = _network(out[walk], half, keys)
        walk = walk[out[walk] >= _U(n)]
    return out.astype(np.int64)


def order_at(positions: np.ndarray, n: int, seed: int, epoch: int, pool: int,
             version: int) -> np.ndarray:
    """Epoch ``epoch``'s order of pool ``pool`` (``n`` samples) at ``positions``: the pool
    position each holds. Version 2 costs O(len(positions)); version 1 draws the whole pool."""
    if version == 1:
        return permutation_v1(n, seed, epoch, pool)[np.asarray(positions, dtype=np.int64)]
    check_order_version(version)
    return feistel(positions, n, round_keys(seed, epoch, pool))
