"""Which codec a column of rows gets, and how nested rows expand into columns.

Pinned because users of the original's ``mooncake.structured_object_store`` read these
decisions (codec names end up in manifests) and its tests reach the helpers by name.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from mooncake_core.structured import MISSING, choose_leaf_codec, escape_key, infer_structure


@pytest.mark.parametrize("rows, codec", [
    ([torch.zeros(3), None, torch.ones(1, 2)], "ragged_tensor"),           # ndim may differ, dtype may not
    ([np.arange(3, dtype=np.int16), np.zeros(2)], "typed_ragged"),
    ([(1, 2), [3.5], []], "typed_ragged"),
    ([True, 7, 2.5, np.int8(1)], "ndarray"),
    ([b"x", bytearray(b"yz"), memoryview(b"q")], "bytes_ragged"),
    (["a", None, "\u00e9"], "utf8_ragged"),
    ([{"k": [1, "x"]}, ["mixed", 1]], "msgpack_ragged"),
])
def test_each_kind_of_column_gets_its_codec(rows, codec) -> None:
    d = choose_leaf_codec(rows)
    assert (d.accepted, d.codec) == (True, codec), d.reason


def test_a_column_no_codec_holds_is_refused_with_a_reason() -> None:
    mixed = choose_leaf_codec([torch.zeros(1, dtype=torch.int8), torch.zeros(1, dtype=torch.int32)])
    assert (mixed.accepted, mixed.codec) == (False, "ragged_tensor") and "int8" in mixed.reason
    for rows in ([], [None, MISSING], ["text", 3], [object()], [np.array(["s"], dtype=object)],
                 [{"ok": 1}] * 300 + [object()]):
        assert choose_leaf_codec(rows).accepted is False, rows
    assert choose_leaf_codec([2**80]).accepted is False  # no numpy dtype holds it


def test_tensor_column_records_its_dtype_and_scalar_column_the_promoted_dtype() -> None:
    assert choose_leaf_codec([torch.zeros(2, dtype=torch.bfloat16)]).metadata == {"dtype": "torch.bfloat16"}
    assert choose_leaf_codec([1, 2.5]).metadata == {"dtype": "float64"}
    assert choose_leaf_codec([[1, 2], [3]]).metadata == {"dtype": "int64"}


def test_dict_rows_expand_into_one_column_per_key_with_missing_apart_from_none() -> None:
    leaves, nodes = [], []
    infer_structure("s", [{"b": 1, "a": "x"}, None, {"a": None}], leaves, nodes)
    assert [(n.path, n.node_type, n.children, n.row_mask) for n in nodes] == [
        ("s", "dict", ["a", "b"], [True, False, True])]
    cols = {leaf.path: leaf.values for leaf in leaves}
    assert cols["s.a"] == ["x", None, None]
    assert cols["s.b"][0] == 1 and cols["s.b"][1] is None and cols["s.b"][2] is MISSING


def test_short_lists_of_containers_expand_per_position_but_lists_of_scalars_stay_one_column() -> None:
    leaves, nodes = [], []
    infer_structure("r", [[{"t": "a"}, {"t": "b"}], [{"t": "c"}], None], leaves, nodes)
    lst = nodes[0]
    assert (lst.node_type, lst.children, lst.lengths, lst.row_mask) == ("list", [0, 1], [2, 1, 0], [True, True, False])
    # the second row has no position 1 (MISSING there); below it, the row has no dict at all
    second = next(n for n in nodes if n.path == "r[1]")
    assert second.row_mask == [True, False, False]
    assert {leaf.path: leaf.values for leaf in leaves}["r[1].t"] == ["b", None, None]
    leaves, nodes = [], []
    infer_structure("r", [[1, 2, 3], [4]], leaves, nodes)
    assert nodes == [] and leaves[0].decision.codec == "typed_ragged"
    leaves, nodes = [], []
    infer_structure("r", [[{"x": 1}] * 9], leaves, nodes)  # longer than 8: kept whole
    assert nodes == [] and leaves[0].decision.codec == "msgpack_ragged"


def test_keys_with_path_characters_are_escaped_so_paths_stay_unambiguous() -> None:
    assert escape_key("a.b") != escape_key("a") + "." + escape_key("b")
    assert [escape_key(k) for k in ("x", "a.b", "c[1]", "d\\e")] == ["x", "a\\.b", "c\\[1]", "d\\\\e"]
    leaves, _ = [], []
    infer_structure("r", [{"k.v": 1}], leaves, [])
    assert leaves[0].path == "r.k\\.v"


def test_nesting_past_the_depth_limit_is_refused() -> None:
    v: object = "leaf"
    for _ in range(33):
        v = {"n": v}
    with pytest.raises(ValueError, match="deeper than"):
        infer_structure("r", [v], [], [])
    v = "leaf"
    for _ in range(30):
        v = {"n": v}
    infer_structure("r", [v], [], [])


def test_missing_is_one_object_even_through_pickle() -> None:
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING and repr(MISSING) == "<MISSING>"
