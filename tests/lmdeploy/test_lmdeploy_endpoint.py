"""Endpoint info (LMDeploy's wire fields), the advertised address, and the per-process engine.

No LMDeploy needed: these run in the main interpreter against the real Transfer Engine.
"""

from __future__ import annotations

import ctypes
import json

import pytest

from mooncake_connectors.lmdeploy.endpoint import Endpoint, EndpointError, local_host, parse_endpoint
from mooncake_connectors.lmdeploy.plan import RegionInfo
from mooncake_connectors.lmdeploy.process_engine import ProcessEngine, engine_transport

# what LMDeploy 0.18's MooncakeBackend.endpoint_info produces (json.dumps'd by CacheEngine)
LMDEPLOY_STYLE = json.dumps({"mr_info": {"0": {"addr": 140000000, "length": 4096, "offset": 0}},
                             "session_id": "10.1.2.3:15001"})


def test_parses_lmdeploys_own_endpoint_info() -> None:
    ep = parse_endpoint(LMDEPLOY_STYLE, peer="http://p:1")
    assert ep.session_id == "10.1.2.3:15001"
    assert ep.mr_info == {"0": RegionInfo(140000000, 4096, 0)}


def test_ours_has_exactly_lmdeploys_fields() -> None:
    ours = Endpoint("127.0.0.1:5", {"0": RegionInfo(1, 2, 3)}).to_json()
    theirs = json.loads(LMDEPLOY_STYLE)
    assert ours.keys() == theirs.keys()
    assert ours["mr_info"]["0"].keys() == theirs["mr_info"]["0"].keys()
    assert parse_endpoint(json.dumps(ours), peer="x") == Endpoint("127.0.0.1:5", {"0": RegionInfo(1, 2, 3)})


@pytest.mark.parametrize("raw, words", [
    ("not json", ["http://p:1", "not JSON"]),
    ("[1]", ["JSON object"]),
    (json.dumps({"mr_info": {}, "session_id": "nohost"}), ["session_id", "'nohost'"]),
    (json.dumps({"mr_info": {}, "session_id": "h:99999"}), ["session_id"]),
    (json.dumps({"session_id": "h:1"}), ["mr_info"]),
    (json.dumps({"mr_info": {"0": {"addr": 1}}, "session_id": "h:1"}), ["mr_info['0']", "length"]),
    (json.dumps({"mr_info": {"0": {"addr": -1, "length": 1}}, "session_id": "h:1"}), ["addr", "non-negative"]),
])
def test_bad_endpoint_info_names_peer_and_field(raw: str, words: list[str]) -> None:
    with pytest.raises(EndpointError) as e:
        parse_endpoint(raw, peer="http://p:1")
    assert "http://p:1" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_local_host_order() -> None:
    assert local_host("http://10.0.0.5:23333", {"MOONCAKE_LOCAL_HOSTNAME": "192.168.1.9"}) == \
        ("192.168.1.9", "MOONCAKE_LOCAL_HOSTNAME")
    assert local_host(None, {"MOONCAKE_LOCAL_HOSTNAME": "192.168.1.9:7000"})[0] == "192.168.1.9"
    assert local_host(None, {"MOONCAKE_LOCAL_HOSTNAME": "fe80::1"})[0] == "fe80::1"
    assert local_host("http://10.0.0.5:23333", {}) == ("10.0.0.5", "local_engine_id")
    assert local_host("http://[fd00::7]:23333", {}) == ("fd00::7", "local_engine_id")
    host, why = local_host("http://0.0.0.0:23333", {})  # a bind-all is not an address to advertise
    assert why in ("default route", "loopback fallback") and host != "0.0.0.0"


def test_process_engine_is_shared_and_closed_with_its_last_user() -> None:
    pe = ProcessEngine()
    e1 = pe.acquire("127.0.0.1")
    e2 = pe.acquire("127.0.0.1")
    assert e1 is e2 and pe.users == 2
    buf = ctypes.create_string_buffer(8192)
    addr = ctypes.addressof(buf)
    pe.register(addr, 8192, "cpu:0")
    pe.register(addr, 8192, "cpu:0")  # a second link advertising the same pool: counted, not re-registered
    assert pe.registered() == {addr: 8192}
    with pytest.raises(ValueError, match="changed under a live link"):
        pe.register(addr, 4096, "cpu:0")
    pe.unregister(addr)
    assert pe.registered() == {addr: 8192}
    pe.unregister(addr)
    assert pe.registered() == {}
    pe.release()
    assert pe.engine is e1 and e1.get_rpc_port() > 0
    pe.release()
    assert pe.engine is None and e1.get_rpc_port() == -1  # port and threads gone
    assert pe.acquire("127.0.0.1") is not e1  # a later link starts a fresh one
    pe.release()


@pytest.mark.parametrize("proto, rank, override, devices, want", [
    ("RDMA", 0, "mlx5_0,mlx5_1", ["mlx5_0"], ("rdma", "mlx5_0,mlx5_1", False)),  # the user's NICs, as given
    ("RDMA", 3, "", ["mlx5_0", "mlx5_1"], ("rdma", "mlx5_1", False)),  # LMDeploy's own pick: rank mod count
    ("RDMA", None, "", ["mlx5_0"], ("rdma", "mlx5_0", False)),
    ("RDMA", 0, "", [], ("tcp", "", True)),  # no RDMA device and no NIC named: tcp, with a warning
    ("TCP", 0, "mlx5_0", ["mlx5_0"], ("tcp", "", False)),
    ("NVLINK", 0, "", [], ("tcp", "", False)),
])
def test_engine_transport_from_lmdeploys_protocol(proto, rank, override, devices, want) -> None:
    t = engine_transport(proto, rank, override, devices)
    assert (t.protocol, t.device_name, t.fallback) == want and t.why


def test_engine_transport_refuses_an_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="'IB'.*RDMA, TCP, NVLINK"):
        engine_transport("IB", 0, "", [])


def test_process_engine_start_failure_is_clear() -> None:
    pe = ProcessEngine()
    with pytest.raises(RuntimeError, match="MOONCAKE_LOCAL_HOSTNAME"):
        pe.acquire("203.0.113.77")  # TEST-NET-3: not an address of this host, cannot bind
    assert pe.users == 0
