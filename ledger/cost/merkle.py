"""RFC 6962 / RFC 9162 Merkle tree over the ledger's record hashes: tree heads and consistency proofs.

A published head (size, root) plus a consistency proof shows the ledger only grew since that head.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from protocol.errors import UsageError

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """SHA256(0x00 || data): the domain-separated hash of one leaf."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA256(0x01 || left || right): the hash of an interior node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves, bottom up; an odd last node is carried up unchanged (RFC 6962 2.1)."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])  # the right edge of a left-full tree
        level = nxt
    return level[0]


def _split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 section 2.1.2 for m = old_size, n = len(leaves)."""
    n = len(leaves)
    if not 0 <= old_size <= n:
        raise ValueError(f"old size {old_size} is not within 0..{n}")
    if old_size in (0, n):
        return []
    return _subproof(old_size, leaves, 0, n, True)


def _subproof(m: int, leaves: Sequence[bytes], lo: int, hi: int, complete: bool) -> list[bytes]:
    n = hi - lo
    if m == n:
        return [] if complete else [root(leaves[lo:hi])]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, leaves, lo, lo + k, complete), root(leaves[lo + k : hi])]
    return [*_subproof(m - k, leaves, lo + k, hi, False), root(leaves[lo : lo + k])]


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> bool:
    """Verify a consistency proof as RFC 9162 section 2.1.4.2 specifies."""
    if old_size < 0 or new_size < old_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof  # the empty tree is a prefix of every tree
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)  # step 1: the old tree is a complete subtree of the new one
    if not path or any(len(c) != 32 for c in path):
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0


def prefix_roots(leaves: Sequence[bytes], sizes: Sequence[int]) -> dict[int, bytes]:
    """MTH(leaves[:s]) for each s in sizes, in one pass: a stack of perfect subtrees (heights strictly
    decreasing) is the tree's right frontier, and folding it from the right gives the RFC 6962 root."""
    wanted = set(sizes)
    out = {0: EMPTY_ROOT} if 0 in wanted else {}
    stack: list[tuple[int, bytes]] = []
    for i, leaf in enumerate(leaves, 1):
        height, node = 0, leaf
        while stack and stack[-1][0] == height:
            node = node_hash(stack.pop()[1], node)
            height += 1
        stack.append((height, node))
        if i in wanted:
            acc = node
            for _, left in reversed(stack[:-1]):
                acc = node_hash(left, acc)
            out[i] = acc
    return out


# ---------------------------------------------------------------- tree heads


class TreeHead(BaseModel):
    """RFC 6962 signed-tree-head content without the signature: tree size and root hash (hex)."""

    model_config = ConfigDict(frozen=True)

    size: int
    root: str

    def __str__(self) -> str:
        return f"{self.size}:{self.root}"


def parse_head(text: str) -> TreeHead:
    """`SIZE:ROOT` as printed by `orch ledger head`."""
    size, sep, root = text.strip().partition(":")
    if not sep or not size.isdigit() or len(root) != 64 or any(c not in "0123456789abcdef" for c in root):
        raise UsageError(f"tree head {text!r} is not SIZE:ROOT (a record count and 64 hex digits)")
    return TreeHead(size=int(size), root=root)


def consistent(leaves: list[bytes], head: TreeHead) -> bool:
    if head.size > len(leaves):
        return False
    proof = consistency_proof(leaves, head.size)
    return verify_consistency(head.size, len(leaves), bytes.fromhex(head.root), root(leaves), proof)
