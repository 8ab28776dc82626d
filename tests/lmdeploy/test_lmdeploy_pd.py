"""LMDeploy 0.18 DistServe end to end: the real proxy, nodes built from LMDeploy's real pieces.

Each test runs one scenario of lmdeploy_scenario.py inside ``unshare -n`` (loopback only: no
public route, no RDMA device) and asserts on the facts it reports. See lmdeploy_node.py for what
is LMDeploy's code and what is a stand-in (the model and the scheduler).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from lmdeploy_harness import HERE, run_venv_json

pytestmark = pytest.mark.integration

CORE = "mooncake_connectors.lmdeploy.backend.MooncakeCoreBackend"
THEIRS = "lmdeploy.pytorch.disagg.backend.mooncake.MooncakeBackend"


def scenario(py: str, netns: list[str], name: str, tmp_path, timeout: float) -> dict[str, Any]:
    logdir = str(tmp_path / name)
    os.makedirs(logdir)
    return run_venv_json(py, [os.path.join(HERE, "lmdeploy_scenario.py"), name, "--logdir", logdir],
                         timeout=timeout, prefix=netns, logdir=logdir)["facts"]


def text_of(resp: dict[str, Any]) -> str:
    body = resp["body"]
    assert "choices" in body, f"request failed: {body}"
    return body["choices"][0]["text"]


def check_migrated(resp: dict[str, Any], prefill: dict[str, Any], decode: dict[str, Any],
                   exclusive: bool = True) -> dict[str, Any]:
    """The completion's KV came byte-exact from the prefill's blocks into the decode's blocks."""
    entries = [d for d in decode["decodes"] if d["digests"] and "kv=" + ",".join(d["digests"]) == text_of(resp)]
    assert entries, f"decode has no migration matching {text_of(resp)!r}"
    d = entries[-1]
    src = prefill["prefills"][str(d["remote_session_id"])]
    assert d["remote_block_ids"] == src["blocks"]  # the proxy handed over the prefill's block ids
    assert d["digests"] == src["digests"]  # byte-exact, in order: prefill block i -> decode block i
    assert len(set(d["local_block_ids"])) == len(d["local_block_ids"])
    if exclusive:  # nothing but the chosen decode blocks changed
        assert d["changed"] == sorted(d["local_block_ids"])
    return d


def assert_no_leaks(state: dict[str, Any]) -> None:
    assert state["free_blocks"] == state["num_blocks"], state
    assert state["sessions"] == []


def test_our_backend_through_lmdeploys_proxy_without_a_route(lmdeploy_python, netns, tmp_path) -> None:
    f = scenario(lmdeploy_python, netns, "ours", tmp_path, timeout=240)
    assert f["route"] is None and f["ibv_devices"] is None  # no public route, no RDMA tooling
    assert [b["registered"] for b in f["backends"]] == [CORE, CORE]
    p, d = f["prefill_state"], f["decode_state"]
    seq = [check_migrated(r, p, d) for r in f["sequential"]]
    assert [len(x["local_block_ids"]) for x in seq] == [1, 3, 7]
    conc = [check_migrated(r, p, d, exclusive=False) for r in f["concurrent"]]
    touched = {b for x in conc for b in x["local_block_ids"]}
    assert all(set(x["changed"]) <= touched for x in conc)  # concurrent migrations touch only their blocks
    # every prefill session was freed by the decode's ZMQ message (the free-cache round trip)
    assert sorted(p["ended"]) == sorted(int(k) for k in p["prefills"])
    assert_no_leaks(p)
    assert_no_leaks(d)
    # one engine per process, one registration of the pool, one link per peer
    for s in (p, d):
        assert s["links"] and len(s["links"]) == 1 and s["engine_users"] == 1 and s["registered"] == 1
    fc = f["free_cache"]
    assert fc["reply"] == {"status": "SUCCESS"}
    assert fc["free_before"] == fc["free_after"] - len(fc["blocks"]) and fc["free_after"] == p["num_blocks"]


def test_failures_mid_migration_deadline_and_unreachable_peer(lmdeploy_python, netns, tmp_path) -> None:
    f = scenario(lmdeploy_python, netns, "failures", tmp_path, timeout=300)
    assert f["route"] is None
    assert text_of(f["r1"]).startswith("kv=")

    fr = f["frozen"]  # prefill SIGSTOPped mid-migration: fails at the 4 s deadline, naming the peer
    msg = fr["response"]["body"]["message"]
    assert "MigrationError" in msg and f["p1"] in msg and "timed out" in msg
    assert 3.5 < fr["seconds_after_go"] < 4 + 5.0
    assert max(fr["health_seconds"]) < 1.0  # the decode's event loop kept answering meanwhile
    assert_no_leaks(f["p1_after_frozen"])  # the frozen prefill freed the request's blocks once it resumed

    kl = f["killed"]  # prefill SIGKILLed mid-migration: fails at once (well inside the deadline)
    msg = kl["response"]["body"]["message"]
    assert "MigrationError" in msg and f["p1"] in msg
    frozen_fail, killed_fail, unreachable_fail = f["decode_after"]["failures"]
    assert 3.5 < frozen_fail["seconds"] < 4 + 5.0  # the migration itself, as the decode timed it
    assert killed_fail["seconds"] < 3.5  # killed 1 s after the migration started: well before the 4 s deadline
    assert kl["seconds_after_kill"] < 10

    assert text_of(f["r4"]).startswith("kv=")  # the decode serves the next request from a new prefill

    ur = f["unreachable"]["body"]["message"]  # engine address unreachable: a clear error naming it
    assert "MigrationError" in ur and f["p3"] in ur and "192.0.2.1" in ur and "unreachable" in ur
    assert unreachable_fail["seconds"] < 2.0
    assert_no_leaks(f["p3_after"])
    assert text_of(f["r6"]).startswith("kv=")
    da = f["decode_after"]
    assert_no_leaks(da)
    assert_no_leaks(f["p2_after"])
    assert da["failed"] == 3 and len(da["links"]) == 3
    assert da["engine_users"] == 3 and da["registered"] == 1  # three peers, one engine, one registration


def test_lmdeploys_own_backend_on_our_engine_and_mixed_pairs(lmdeploy_python, netns, tmp_path) -> None:
    f = scenario(lmdeploy_python, netns, "mixed", tmp_path, timeout=300)
    assert f["route"] == "127.0.0.1"  # LMDeploy's backend needs a default route: given one through lo
    b = f["backends"]
    assert (b["pl"]["registered"], b["dl"]["registered"], b["pc"]["registered"], b["dc"]["registered"]) == \
        (THEIRS, THEIRS, CORE, CORE)
    st = f["states"]
    for r in f["lmdeploy_lmdeploy"]:
        check_migrated(r, st["pl"], st["dl"])
    for r in f["lmdeploy_core"]:
        check_migrated(r, st["pl"], st["dc"])
    for r in f["core_lmdeploy"]:
        check_migrated(r, st["pc"], st["dl"])
    for s in st.values():
        assert_no_leaks(s)
        assert s["errors"] == []
