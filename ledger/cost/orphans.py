"""Orphan detection: packages whose open record was never closed (a crash or a kill), found column-wise.

Also the grouping primitives (`encode`, `unclosed`) that accounting shares; nothing here reads a file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def encode(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Integer codes (-1 for null) into distinct values: grouping on integers, never on Python strings."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    codes = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    # a given dictionary may repeat a value: re-encode the (small) dictionary so equal values share a code
    unique = pc.dictionary_encode(arr.dictionary)
    remap = np.append(unique.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64), -1)
    return remap[codes], unique.dictionary


def compact_pairs(key: np.ndarray, other: np.ndarray, other_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids of the (key, other) pairs, and the key of each pair id."""
    width = max(other_count, 1)
    pair = key * width + other
    span = (int(key.max()) + 1) * width if len(key) else 0
    if span <= 4 * len(key) + 1024:  # a small product space: mark and count instead of sorting
        seen = np.zeros(span, dtype=bool)
        seen[pair] = True
        dense = np.cumsum(seen) - 1
        return dense[pair], np.flatnonzero(seen) // width
    ids, inverse = np.unique(pair, return_inverse=True)
    return inverse.reshape(-1), ids // width


def unclosed(run: np.ndarray, package: np.ndarray, n_packages: int, is_open: np.ndarray,
             seq: np.ndarray) -> np.ndarray:
    """True for open records with no later close (any other status) of the same (run_id, package)."""
    if not is_open.any():
        return np.zeros(len(run), dtype=bool)
    pair, _ = compact_pairs(run, package, n_packages)
    last_close = np.full(int(pair.max()) + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_close, pair[~is_open], seq[~is_open])
    result: np.ndarray = is_open & ~(last_close[pair] > seq)
    return result


def empty_keys() -> pa.Table:
    return pa.table({"seq": pa.array([], pa.int64()), "run_id": pa.array([], pa.string()),
                     "package": pa.array([], pa.string()), "status": pa.array([], pa.string())})


def orphans_of(keys: pa.Table) -> list[tuple[str, str]]:
    """(run_id, package) of open records with no later close of the same package in the same run."""
    if keys.num_rows == 0:
        return []
    run, runs = encode(keys["run_id"])
    package, packages = encode(keys["package"])
    status, statuses = encode(keys["status"])
    is_open = np.append(np.array([v == "open" for v in statuses.to_pylist()], dtype=bool), False)[status]
    seq = keys["seq"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.int64)
    left = np.flatnonzero(unclosed(run, package, len(packages), is_open, seq))
    left = left[np.argsort(seq[left], kind="stable")]
    return list(zip(runs.take(pa.array(run[left])).to_pylist(), packages.take(pa.array(package[left])).to_pylist(),
                    strict=True))
