"""RFC 6962 Merkle tree heads and consistency proofs against published vectors and an RFC-text reference."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.cost import merkle
from protocol.errors import UsageError

# RFC 6962 test leaves and roots as published with certificate-transparency / trillian
LEAVES = [bytes.fromhex(x) for x in ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                     "606162636465666768696a6b6c6d6e6f"]]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CONSISTENCY = {  # (old size, new size) -> published proof
    (1, 1): [],
    (1, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"],
}


def ref_mth(data: list[bytes]) -> bytes:
    """MTH exactly as RFC 6962 section 2.1 writes it, recursively over the raw entries."""
    n = len(data)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + ref_mth(data[:k]) + ref_mth(data[k:])).digest()


def test_published_roots_and_reference_agree() -> None:
    hashed = [merkle.leaf_hash(x) for x in LEAVES]
    for n, want in enumerate(ROOTS):
        assert merkle.root(hashed[:n]).hex() == want
        assert ref_mth(LEAVES[:n]).hex() == want


def test_published_consistency_proofs() -> None:
    hashed = [merkle.leaf_hash(x) for x in LEAVES]
    for (m, n), proof in CONSISTENCY.items():
        got = merkle.consistency_proof(hashed[:n], m)
        assert [p.hex() for p in got] == proof
        old, new = bytes.fromhex(ROOTS[m]), bytes.fromhex(ROOTS[n])
        assert merkle.verify_consistency(m, n, old, new, got)
        assert not merkle.verify_consistency(m, n, new, old, got) or m == n  # swapped roots


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 70), data=st.data())
def test_consistency_proofs_verify_and_tampering_fails(n: int, data: st.DataObject) -> None:
    entries = [i.to_bytes(2, "big") for i in range(n)]
    hashed = [merkle.leaf_hash(x) for x in entries]
    m = data.draw(st.integers(1, n))
    assert merkle.root(hashed).hex() == ref_mth(entries).hex()
    old, new = ref_mth(entries[:m]), ref_mth(entries)
    proof = merkle.consistency_proof(hashed, m)
    assert merkle.verify_consistency(m, n, old, new, proof)
    if proof:
        i = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[i] = bytes([bad[i][0] ^ 0x10]) + bad[i][1:]
        assert not merkle.verify_consistency(m, n, old, new, bad)
        assert not merkle.verify_consistency(m, n, old, new, proof[:-1])
        assert not merkle.verify_consistency(m, n, old, new, [*proof, new])
        assert not merkle.verify_consistency(m + 1 if m < n else m - 1, n, old, new, proof)
    other = bytes([old[0] ^ 1]) + old[1:]
    assert not merkle.verify_consistency(m, n, other, new, proof) or m == 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 70), data=st.data())
def test_prefix_roots_are_the_roots_that_consistency_proofs_verify(n: int, data: st.DataObject) -> None:
    leaves = [merkle.leaf_hash(bytes([i % 256, i // 256])) for i in range(n)]
    sizes = data.draw(st.lists(st.integers(0, n), max_size=6))
    roots = merkle.prefix_roots(leaves, sizes)
    assert set(roots) == set(sizes)
    for m in sizes:
        assert roots[m] == merkle.root(leaves[:m])
        proof = merkle.consistency_proof(leaves, m)
        assert merkle.verify_consistency(m, n, roots[m], merkle.root(leaves), proof)


H = [merkle.leaf_hash(x) for x in LEAVES]
EMPTY = bytes.fromhex(ROOTS[0])


def test_sizes_out_of_order_never_verify() -> None:
    # a one-entry proof whose only node equals both roots would verify if the sizes were not checked first:
    # sn = new_size - 1 = 0 and no fold happens
    assert not merkle.verify_consistency(-1, 1, H[0], H[0], [H[0]])
    assert not merkle.verify_consistency(2, 1, bytes.fromhex(ROOTS[2]), bytes.fromhex(ROOTS[1]), [H[1]])


def test_the_empty_tree_is_a_prefix_of_every_tree_without_a_proof() -> None:
    assert merkle.verify_consistency(0, 0, EMPTY, EMPTY, [])
    assert merkle.verify_consistency(0, 8, EMPTY, bytes.fromhex(ROOTS[8]), [])
    assert not merkle.verify_consistency(0, 8, EMPTY, bytes.fromhex(ROOTS[8]), [H[0]])
    assert not merkle.verify_consistency(0, 0, EMPTY, H[0], [])


def test_proof_nodes_must_be_sha256_digests() -> None:
    # (1, 2): the proof is [H1] and the new root SHA256(0x01 || H0 || H1); a 31-byte node folded the same way
    # would match its own forged root
    assert merkle.verify_consistency(1, 2, H[0], merkle.node_hash(H[0], H[1]), [H[1]])
    short = H[1][:31]
    assert not merkle.verify_consistency(1, 2, H[0], merkle.node_hash(H[0], short), [short])
    long = H[1] + b"\x00"
    assert not merkle.verify_consistency(1, 2, H[0], merkle.node_hash(H[0], long), [long])


def test_an_old_size_that_is_not_a_power_of_two_needs_a_proof() -> None:
    assert not merkle.verify_consistency(3, 5, bytes.fromhex(ROOTS[3]), bytes.fromhex(ROOTS[5]), [])


def test_an_old_size_beyond_the_tree_is_refused_by_name() -> None:
    for old in (-1, 9):
        with pytest.raises(ValueError) as err:
            merkle.consistency_proof(H, old)
        assert str(err.value) == f"old size {old} is not within 0..8"


# ---------------------------------------------------------------- tree heads: `SIZE:ROOT` and consistency with it

ROOT8 = ROOTS[8]


def test_a_tree_head_reads_and_prints_as_size_colon_root() -> None:
    head = merkle.parse_head(f"8:{ROOT8}")
    assert (head.size, head.root) == (8, ROOT8)
    assert str(head) == f"8:{ROOT8}"
    assert merkle.parse_head(f"  0:{ROOTS[0]}\n") == merkle.TreeHead(size=0, root=ROOTS[0])  # as pasted from a file


@pytest.mark.parametrize("text", [
    ROOT8,                      # no separator
    f"8{ROOT8}",                # no separator, digits glued on
    f"x:{ROOT8}",               # size not a count
    f"-1:{ROOT8}",              # a sign is not a digit
    f":{ROOT8}",                # empty size
    f"8:{ROOT8[:63]}",          # 63 hex digits
    f"8:{ROOT8}0",              # 65 hex digits
    f"8:{ROOT8[:63]}g",         # 64 characters, one not hex
    f"8:{ROOT8[:63]}X",         # 64 characters, one not hex
    f"8:1:{ROOT8[2:]}",         # two separators
    f"8:{ROOT8.upper()}",       # upper-case hex is not what `orch ledger head` prints
])
def test_a_tree_head_that_is_not_size_colon_64_hex_is_refused_in_its_own_words(text: str) -> None:
    with pytest.raises(UsageError) as err:
        merkle.parse_head(text)
    assert str(err.value) == f"tree head {text!r} is not SIZE:ROOT (a record count and 64 hex digits)"


def test_every_published_prefix_head_is_consistent_with_the_eight_leaf_tree() -> None:
    for size in range(9):
        assert merkle.consistent(H, merkle.TreeHead(size=size, root=ROOTS[size])), size


def test_a_head_is_consistent_only_with_its_own_root_and_a_tree_at_least_its_size() -> None:
    # the full tree is its own head (size == number of leaves), but not a head one record longer than the tree
    assert merkle.consistent(H[:5], merkle.TreeHead(size=5, root=ROOTS[5]))
    assert not merkle.consistent(H[:5], merkle.TreeHead(size=6, root=ROOTS[6]))
    # a head of the right size with another prefix's root: the ledger was rewritten, not extended
    assert not merkle.consistent(H, merkle.TreeHead(size=5, root=ROOTS[4]))
    assert not merkle.consistent(H, merkle.TreeHead(size=8, root=ROOTS[7]))
    # the same root claimed for another size
    assert not merkle.consistent(H, merkle.TreeHead(size=6, root=ROOTS[5]))
    # a tree whose fourth leaf changed is consistent with the heads before it and with none from it on
    changed = [*H[:3], merkle.leaf_hash(b"2022"), *H[4:]]
    assert [merkle.consistent(changed, merkle.TreeHead(size=s, root=ROOTS[s])) for s in range(9)] == (
        [True] * 4 + [False] * 5)
