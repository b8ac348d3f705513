"""ledger/cost/orphans.py: open records with no later close of the same (run, package), found column-wise."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ledger.cost.orphans import compact_pairs, empty_keys, encode, orphans_of, unclosed


def test_encode_gives_one_code_per_distinct_value_and_minus_one_for_null() -> None:
    codes, values = encode(pa.chunked_array([["a", "b"], [None, "a"]]))
    assert codes.tolist() == [0, 1, -1, 0] and values.to_pylist() == ["a", "b"]
    # a dictionary that repeats a value: equal values share a code
    repeated = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, None]), pa.array(["x", "y", "x"]))
    codes, values = encode(repeated)
    assert codes.tolist() == [0, 1, 0, -1] and values.to_pylist() == ["x", "y"]


def test_compact_pairs_numbers_the_pairs_densely_in_both_paths() -> None:
    # small product space (marking): pairs 0*2+1, 0*2+1, 1*2+0 -> ids 0, 0, 1; keys of the ids 0, 1
    ids, keys = compact_pairs(np.array([0, 0, 1]), np.array([1, 1, 0]), 2)
    assert ids.tolist() == [0, 0, 1] and keys.tolist() == [0, 1]
    # a large one (sorting): the same answer
    ids, keys = compact_pairs(np.array([10**6, 3, 10**6]), np.array([0, 0, 0]), 1)
    assert ids.tolist() == [1, 0, 1] and keys.tolist() == [3, 10**6]


def test_unclosed_needs_a_later_close_of_the_same_pair() -> None:
    run = np.array([0, 0, 0, 1])
    package = np.array([0, 0, 1, 0])
    is_open = np.array([True, False, True, True])
    assert unclosed(run, package, 2, is_open, np.array([0, 1, 2, 3])).tolist() == [False, False, True, True]
    # a close recorded before the open (lower seq) does not close it
    assert unclosed(run, package, 2, is_open, np.array([5, 1, 2, 3])).tolist() == [True, False, True, True]
    assert unclosed(run, package, 2, np.zeros(4, dtype=bool), np.arange(4)).tolist() == [False] * 4


def test_orphans_are_listed_in_ledger_order() -> None:
    rows = [(0, "r1", "checks", "open"), (1, "r1", "checks", "ok"), (2, "r1", "train-A", "open"),
            (3, "r2", "checks", "open"), (4, "r2", "checks", "interrupted"), (5, "r1", "checks", "open"),
            (6, "r3", "score", "not-run")]  # fmt: skip
    keys = pa.table({"seq": [r[0] for r in rows], "run_id": [r[1] for r in rows], "package": [r[2] for r in rows],
                     "status": [r[3] for r in rows]})  # fmt: skip
    assert orphans_of(keys) == [("r1", "train-A"), ("r1", "checks")]
    assert orphans_of(empty_keys()) == []
