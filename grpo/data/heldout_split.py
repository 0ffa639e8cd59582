"""The deterministic train / held-out split, and stable ids for rows that have none.

Split rule: u = int(sha256(salt + ":" + id)[:16 hex], 16) / 2**64; the row is held out iff u < fraction
(a stable uniform hash; Python's hash() is salted per process, so it is not used).
"""

from __future__ import annotations

import hashlib
from typing import Sequence, TypeVar

HASH_HEX_DIGITS = 16  # 64 bits of the digest: split fractions are exact to ~1e-19
_HASH_SPACE = float(16**HASH_HEX_DIGITS)

T = TypeVar("T")


def stable_hash01(key: str, salt: str = "") -> float:
    """A uniform number in [0, 1) from sha256(salt:key): identical on every machine and run."""
    digest = hashlib.sha256(f"{salt}:{key}".encode("utf-8")).hexdigest()
    return int(digest[:HASH_HEX_DIGITS], 16) / _HASH_SPACE


def content_id(*parts: str) -> str:
    """A short stable id for a row that has none: sha256 of its identifying text."""
    joined = "\x1f".join(parts)  # unit separator: ("ab", "c") and ("a", "bc") hash differently
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:HASH_HEX_DIGITS]


def split_heldout(
    items: Sequence[T], ids: Sequence[str], heldout_fraction: float, salt: str = ""
) -> tuple[list[T], list[T]]:
    """(train, heldout) keeping input order; an item is held out iff stable_hash01(id, salt) < heldout_fraction."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction!r} must be in [0, 1): e.g. 0.1 holds out ~10%")
    train: list[T] = []
    heldout: list[T] = []
    for item, key in zip(items, ids, strict=True):
        (heldout if stable_hash01(key, salt) < heldout_fraction else train).append(item)
    return train, heldout
