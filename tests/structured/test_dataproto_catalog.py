"""DataProto handles and the catalog of logical rows: what a reader resolves, what is refused.

The handle format is the original's (handles cross processes and implementations); the
catalog must group reads by shared location and keep a fragment exactly while a row uses it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mooncake_core.structured import (
    DataProtoCatalog,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    export_dataproto_ref,
    import_dataproto_ref,
)


def _ref(manifest: str, fields: dict[str, str], rows: int, **extra) -> MooncakeDataProtoRef:
    return MooncakeDataProtoRef(
        batch_size=rows, stage_refs={"s": RemoteBundleRef(manifest_key=manifest, manifest={"big": "not exported"})},
        field_index={f: StructuredFieldLocation("s", f"{sec}.{f}", sec) for f, sec in fields.items()},
        meta_info={}, **extra)


def test_a_ref_survives_its_json_handle_without_the_manifest_contents() -> None:
    ref = _ref("m/1", {"ids": "batch", "text": "non_tensor_batch"}, 3, global_indexes=[4, 5, 6],
               storage_group_id="g1")
    ref.meta_info = {"step": np.int64(7), "temps": np.array([0.5, 1.0]), "pair": (1, 2)}
    handle = json.loads(json.dumps(export_dataproto_ref(ref)))
    assert handle["stage_refs"] == {"s": {"manifest_key": "m/1"}} and handle["storage_group_id"] == "g1"
    back = import_dataproto_ref(handle)
    assert back.field_index == ref.field_index and back.global_indexes == [4, 5, 6]
    assert back.meta_info == {"step": 7, "temps": [0.5, 1.0], "pair": [1, 2]}
    assert back.stage_refs["s"].manifest == {} and back.storage_group_id == "g1"
    ref.meta_info = {"bad": object()}
    with pytest.raises(TypeError, match="JSON-safe"):
        export_dataproto_ref(ref)


@pytest.mark.parametrize("change, message", [
    ({"type": "other"}, "not a Mooncake DataProto ref handle"),
    ({"version": 3}, "unsupported DataProto ref handle version: 3"),
    ({"version": 2}, "storage_group_id"),
    ({"kind": "flat"}, "kind"),
    ({"field_index": {"x": {"stage": "nope", "member": "batch.x", "section": "batch"}}}, "unknown stage 'nope'"),
    ({"field_index": {"x": {"stage": "s", "member": "batch.x", "section": "meta"}}}, "section"),
    ({"global_indexes": [1, True]}, "global_indexes"),
    ({"batch_size": "many"}, "batch_size"),
])
def test_a_malformed_handle_is_refused_naming_the_problem(change, message) -> None:
    handle = {**export_dataproto_ref(_ref("m/1", {"x": "batch"}, 1)), **change}
    with pytest.raises(ValueError, match=message):
        import_dataproto_ref(handle)


def test_reads_group_fields_by_shared_rows_across_fragments_in_key_order() -> None:
    cat = DataProtoCatalog()
    cat.update("p", ["k1", "k2", "k3"], tags=[{"n": 1}, {"n": 2}, {"n": 3}],
               handle=export_dataproto_ref(_ref("m/roll", {"ids": "batch", "mask": "batch"}, 3)))
    out = cat.update("p", ["k3", "k1"], tags=[{"done": True}, {"done": True}],
                     handle=export_dataproto_ref(_ref("m/rew", {"reward": "batch"}, 2)))
    assert out["tags"] == [{"n": 3, "done": True}, {"n": 1, "done": True}]
    assert out["fields"] == ["ids", "mask", "reward"]
    plan = cat.resolve("p", ["k1", "k3"], ["reward", "mask", "ids"])
    assert plan["field_groups"] == [
        {"fields": ["reward"], "locations": [("m/rew", 1), ("m/rew", 0)]},
        {"fields": ["mask", "ids"], "locations": [("m/roll", 0), ("m/roll", 2)]},
    ]
    assert sorted(plan["handles"]) == ["m/rew", "m/roll"] and plan["tags"][1] == {"n": 3, "done": True}
    with pytest.raises(ValueError, match="not ready for key 'k2'"):
        cat.resolve("p", ["k2"], ["reward"])
    assert cat.list("p")["p"]["k2"] == {"n": 2} and cat.list("q") == {}


def test_a_fragment_is_kept_exactly_while_some_row_uses_it() -> None:
    cat = DataProtoCatalog()
    old = export_dataproto_ref(_ref("m/old", {"v": "batch"}, 2))
    cat.update("p", ["a", "b"], handle=old)
    cat.update("p", ["a"], handle=export_dataproto_ref(_ref("m/new", {"v": "batch"}, 1)))
    assert set(cat.resolve("p", ["a", "b"])["handles"]) == {"m/old", "m/new"}
    cat.remove("p", ["b"])  # m/old has no row left: its handle goes
    with pytest.raises(ValueError, match="collision"):  # so the id is free only for the same handle
        cat.update("p", ["x"], handle=export_dataproto_ref(_ref("m/new", {"w": "batch"}, 1)))
    cat.update("p", ["b"], handle=export_dataproto_ref(_ref("m/old", {"v": "batch"}, 1)))  # reusable now
    cat.remove("p", ["a", "b", "never-there"])
    assert cat.list() == {}


def test_bad_updates_change_nothing() -> None:
    cat = DataProtoCatalog()
    cat.update("p", ["a"], tags=[{"t": 1}])
    two_stages = export_dataproto_ref(_ref("m/1", {"v": "batch"}, 1))
    two_stages["stage_refs"]["other"] = {"manifest_key": "m/2"}
    for kwargs, err in [
        ({"keys": ["a", "a"], "tags": [{}, {}]}, "unique"),
        ({"keys": "a", "tags": [{}]}, "sequence"),
        ({"keys": ["a"]}, "requires tags or a DataProto handle"),
        ({"keys": ["a", "b"], "handle": export_dataproto_ref(_ref("m/1", {"v": "batch"}, 1))}, "does not match 2"),
        ({"keys": ["a"], "handle": two_stages}, "exactly one"),
    ]:
        with pytest.raises(ValueError, match=err):
            cat.update("p", **kwargs)
    with pytest.raises(TypeError, match="mappings"):
        cat.update("p", ["a"], tags=["t=2"])
    assert cat.list() == {"p": {"a": {"t": 1}}}
    with pytest.raises(ValueError, match="not found"):
        cat.resolve("p", ["zz"])
    with pytest.raises(ValueError, match="any fields"):
        cat.resolve("p", ["a"])
