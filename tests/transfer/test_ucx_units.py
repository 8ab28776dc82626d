"""Pure parts of the UCX transport: library order, device names, lanes, the no-RDMA message."""

from __future__ import annotations

import pytest

from mooncake_core.transfer.ucx import lanes, library

CONTEXT_INFO = """#
# UCP context
#
#      resource 0  :  md 0  dev 0  flags -- self/memory
#      resource 1  :  md 1  dev 1  flags -- tcp/eth0
#      resource 2  :  md 5  dev 3  flags -- rc_mlx5/mlx5_0:1
#      resource 3  :  md 2  dev 0  flags -- posix/memory
#"""

EP_INFO = """#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] seg 4294967295 rma_bw#0 am
#                 lane[1]:  0:tcp/eth0.0 md[0]              -> md[0]/tcp/sysdev[255] seg 4294967295 rma_bw#1 wireup
#                 lane[2]:  3:rc_mlx5/mlx5_0:1 md[5]         -> md[5]/ib/sysdev[3] rma_bw#2
#"""


def test_override_means_one_source_or_a_path():
    assert library._sources_for("") == (("loaded", "system", "nixl", "wheel"), "")
    assert library._sources_for(" NIXL ") == (("nixl",), "")
    assert library._sources_for("/opt/hpcx/ucx/lib/libucp.so") == (("path",), "/opt/hpcx/ucx/lib/libucp.so")


def test_candidates_keep_the_order_and_every_path_of_a_source():
    found = {"loaded": lambda: [], "system": lambda: ["libucp.so.0"], "nixl": lambda: ["/a/libucp-1.so", "/b/x.so"],
             "wheel": lambda: ["/w/libucp.so.0"]}
    got = library.candidates(("loaded", "system", "nixl", "wheel"), finders=found)
    assert got == [("system", "libucp.so.0"), ("nixl", "/a/libucp-1.so"), ("nixl", "/b/x.so"),
                   ("wheel", "/w/libucp.so.0")]


def test_rdma_modules_skipped_only_without_rdma_devices_and_user_setting():
    assert library.modules_setting({}, []) == "^" + ",".join(library.RDMA_MODULES)
    assert library.modules_setting({}, ["mlx5_0"]) is None
    assert library.modules_setting({"UCX_MODULES": "ib"}, []) is None


def test_unloadable_override_names_every_place_tried(monkeypatch, tmp_path):
    monkeypatch.setattr(library, "_loaded", None)
    monkeypatch.setenv("MC_UCX_LIBRARY", str(tmp_path / "nope" / "libucp.so"))
    with pytest.raises(library.UcxNotFound) as e:
        library.load()
    assert "nope/libucp.so" in str(e.value) and "libucx-cu13" in str(e.value)


def test_resources_and_lanes_are_parsed():
    assert [r.lane for r in lanes.resources(CONTEXT_INFO)] == ["self/memory", "tcp/eth0", "rc_mlx5/mlx5_0:1",
                                                               "posix/memory"]
    eps = lanes.ep_lanes(EP_INFO)
    assert [(ln.index, ln.name) for ln in eps] == [(0, "tcp/lo"), (1, "tcp/eth0"), (2, "rc_mlx5/mlx5_0:1")]
    assert eps[0].roles == ("rma_bw#0", "am")
    assert lanes.rma_lanes(eps) == ["rc_mlx5/mlx5_0:1", "tcp/eth0", "tcp/lo"]


def test_device_names_map_to_ucx_net_devices():
    rdma = {"mlx5_0": [1], "mlx5_1": [1, 2]}
    nets = ["eth0", "lo"]
    assert lanes.net_devices("", rdma, nets) == ""
    assert lanes.net_devices("mlx5_0,mlx5_1", rdma, nets) == "mlx5_0:1,mlx5_1:1,mlx5_1:2"
    assert lanes.net_devices("mlx5_1:2, eth0", rdma, nets) == "mlx5_1:2,eth0"
    with pytest.raises(ValueError) as e:
        lanes.net_devices("mlx5_0,mlx5_9", rdma, nets)
    assert "mlx5_9" in str(e.value) and "mlx5_0, mlx5_1" in str(e.value) and "eth0" in str(e.value)
    with pytest.raises(ValueError, match="mlx5_0:3"):
        lanes.net_devices("mlx5_0:3", rdma, nets)


def test_no_rdma_warning_names_lanes_and_the_fix():
    tcp_only = lanes.resources(CONTEXT_INFO.replace("rc_mlx5/mlx5_0:1", "tcp/lo"))
    assert lanes.no_rdma_warning(lanes.resources(CONTEXT_INFO), "system", "/usr/lib/libucp.so.0", ["mlx5_0"]) is None
    msg = lanes.no_rdma_warning(tcp_only, "wheel", "/site/libucx/lib/libucp.so.0", ["mlx5_0"])
    assert msg is not None and "tcp/eth0" in msg and "built without verbs" in msg and "MC_UCX_LIBRARY" in msg
    msg = lanes.no_rdma_warning(tcp_only, "wheel", "/x", [])
    assert msg is not None and "no RDMA device" in msg
    msg = lanes.no_rdma_warning(tcp_only, "system", "/usr/lib/libucp.so.0", ["mlx5_0"])
    assert msg is not None and "ulimit -l" in msg


def test_original_rdma_variables_map_to_ucx_unless_ucx_is_set():
    env = {"MC_GID_INDEX": "3", "MC_MTU": "4096", "MC_IB_TC": "106", "UCX_IB_TRAFFIC_CLASS": "96", "MC_MAX_WR": "9"}
    assert lanes.mc_config(env) == {"IB_GID_INDEX": "3", "IB_PATH_MTU": "4096"}
    rdma = {"mlx5_0": [1, 2]}
    assert lanes.net_devices("mlx5_0", rdma, [], default_port=2) == "mlx5_0:2"
    with pytest.raises(ValueError, match="MC_IB_PORT"):
        lanes.net_devices("mlx5_0", rdma, [], default_port=3)


def test_rails_slices_windows_pairing():
    import numpy as np

    from mooncake_core.transfer.ucx import plan
    assert plan.rail_groups("") == [""] and plan.rail_groups("d0") == ["d0"]
    assert plan.rail_groups("mlx5_0:1,mlx5_0:2,mlx5_1:1") == ["mlx5_0:1,mlx5_0:2", "mlx5_1:1"]
    assert plan.rail_groups("mlx5_0:1,mlx5_0:2") == ["mlx5_0:1,mlx5_0:2"]
    assert [plan.rail_name(g) for g in ("", "mlx5_0:1,mlx5_0:2", "eth1")] == ["all", "mlx5_0", "eth1"]
    assert plan.pair("d1", 0, ["d0", "d1"]) == 1 and plan.pair("mlx5_2", 3, ["d0", "d1"]) == 1
    a = np.array
    loc, rem, n, reg = plan.slice_blocks(a([0, 1000]), a([5000, 9000]), a([25, 3]), a([0, 1]), 10)
    assert loc.tolist() == [0, 10, 20, 1000] and rem.tolist() == [5000, 5010, 5020, 9000]
    assert n.tolist() == [10, 10, 5, 3] and reg.tolist() == [0, 0, 0, 1]
    assert plan.windows(a([4, 4, 4, 20, 1, 1]), 8) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert plan.windows(a([], dtype=np.int64), 8) == []
    with pytest.raises(ValueError):
        plan.slice_blocks(a([0]), a([0]), a([1]), a([0]), 0)


def test_topology_prefers_numa_local_and_pcie_closest_nics():
    from mooncake_core.transfer.topology import Device, build, pci_distance
    sw0, sw1 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    nics = [Device("mlx5_0", f"{sw0}/0000:02:00.0", 0), Device("mlx5_1", f"{sw0}/0000:03:00.0", 0),
            Device("mlx5_2", f"{sw1}/0000:82:00.0", 1), Device("eth9", "", -1)]
    gpus = [Device("0000:04:00.0", f"{sw0}/0000:04:00.0", 0), Device("0000:83:00.0", f"{sw1}/0000:83:00.0", 1)]
    topo = build(nics, [0, 1], gpus)
    assert topo["cpu:0"] == [["mlx5_0", "mlx5_1"], ["mlx5_2", "eth9"]]
    assert topo["cpu:1"][0] == ["mlx5_2"]
    assert topo["cuda:0"][0] == ["mlx5_0", "mlx5_1"] and topo["cuda:1"][0] == ["mlx5_2"]
    assert pci_distance(f"{sw0}/0000:02:00.0", f"{sw0}/0000:04:00.0") == 2
    assert pci_distance("", f"{sw0}/x") > 100
    assert build([Device("eth0", "", -1)], [0], [])["cpu:0"][0] == ["eth0"]  # one node: it is local


def test_custom_topology_and_preferred_nics(tmp_path):
    from mooncake_core.transfer import topology
    topo = topology.parse('{"cpu:0": [["d1"], ["d0"]], "cuda:0": [["mlx5_0"], []]}')
    assert topology.preferred(topo, "cpu:0", ["d0", "d1"]) == (["d1"], ["d0"])
    assert topology.preferred(topo, "cuda:0", ["d0", "d1"]) == (["d0", "d1"], [])  # none of its NICs is ours
    assert topology.preferred(topo, "cpu:3", ["d0", "d1"]) == (["d1"], ["d0"])  # unknown node: node 0's
    with pytest.raises(ValueError, match="cpu:1"):
        topology.parse('{"cpu:1": ["d0"]}')
    f = tmp_path / "topo.json"
    f.write_text('{"cpu:0": [["d0"], ["d1"]]}')
    assert topology.local("", str(f)) == {"cpu:0": [["d0"], ["d1"]]}
    with pytest.raises(ValueError, match="MC_CUSTOM_TOPO_JSON"):
        topology.local("", str(tmp_path / "missing.json"))


def test_memlock_warning_only_with_rdma_lanes_and_a_low_limit():
    rdma = lanes.resources(CONTEXT_INFO)
    tcp_only = lanes.resources(CONTEXT_INFO.replace("rc_mlx5/mlx5_0:1", "tcp/lo"))
    msg = lanes.memlock_warning(64 << 10, -1, rdma)
    assert msg is not None and "64 KiB" in msg and "ulimit -l unlimited" in msg and "memlock=-1" in msg
    assert lanes.memlock_warning(-1, -1, rdma) is None
    assert lanes.memlock_warning(64 << 10, -1, tcp_only) is None


def test_pieces_and_parts_cover_every_byte_once():
    import numpy as np

    from mooncake_core.transfer.ucx import plan
    assert plan.pieces(64 << 20, 2) == [(0, 32 << 20), (32 << 20, 32 << 20)]
    assert plan.pieces(3000, 2) == [(0, 3000)] and plan.pieces(1 << 20, 1) == [(0, 1 << 20)]
    for length, n in ((5 << 20, 3), ((2 << 20) + 1, 2), (12289, 4), (10 << 20, 7)):
        got = plan.pieces(length, n)
        assert len(got) <= n and sum(x for _, x in got) == length
        assert all(off % 4096 == 0 for off, _ in got)  # whole pages per worker
        assert [off for off, _ in got] == [0] + list(np.cumsum([x for _, x in got])[:-1])
    rng = np.random.default_rng(3)
    for n in (2, 3, 4):
        length = rng.integers(1, 1 << 16, 997)
        parts = plan.split_blocks(length, n)
        assert parts[0][0] == 0 and parts[-1][1] == len(length) and len(parts) == n
        assert all(a < b and b == c for (a, b), (c, _) in zip(parts, parts[1:] + [(len(length), 0)]))
        share = [int(length[a:b].sum()) for a, b in parts]
        assert max(share) - min(share) <= 2 * int(length.max())  # near-equal bytes
    assert plan.split_blocks(np.array([5]), 2) == [(0, 1)]
    assert plan.split_blocks(np.array([1, 1, 1]), 4) == [(0, 1), (1, 2), (2, 3)]


def test_tcp_tuning_yields_to_the_users_ucx_variables():
    assert lanes.tuning({}) == lanes.TCP_TUNING  # one tcp device: UCX's PUT kept
    assert lanes.tuning({}, tcp_devices=2) == {**lanes.TCP_TUNING, "TCP_PUT_ENABLE": "n"}
    got = lanes.tuning({"UCX_TCP_TX_SEG_SIZE": "8K", "UCX_TCP_PUT_ENABLE": "y"}, tcp_devices=2)
    assert got == {k: v for k, v in lanes.TCP_TUNING.items() if k != "TCP_TX_SEG_SIZE"}
    assert got["TCP_RX_SEG_SIZE"] == "1M"


def test_tcp_device_count_of_a_context():
    ifaces = ["eth0", "lo", "d0", "d1"]
    assert lanes.tcp_device_count("", ifaces) == 4
    assert lanes.tcp_device_count("all", ifaces) == 4
    assert lanes.tcp_device_count("d0", ifaces) == 1
    assert lanes.tcp_device_count("d0,d1", ifaces) == 2
    assert lanes.tcp_device_count("mlx5_0:1,mlx5_0:2", ifaces) == 0
    assert lanes.tcp_device_count("mlx5_0:1, eth0", ifaces) == 1


def test_default_tcp_interface_picks_one_non_loopback_interface():
    lo = {"lo": ["127.0.0.1", "::1"]}
    one = {**lo, "eth0": ["192.0.2.2", "fe80::1%eth0"]}
    two = {**one, "eth1": ["10.0.0.5"], "docker0": ["172.17.0.1"]}
    # the only real interface, whatever the engine's own address (127.0.0.1 included: from lo it
    # could not reach a peer named by the host's address)
    assert lanes.default_tcp_interface(one, ["127.0.0.1"], "192.0.2.2") == "eth0"
    assert lanes.default_tcp_interface(one, ["192.0.2.2"], None) == "eth0"
    # several: the one holding the engine's address, else the default route's source, else none
    assert lanes.default_tcp_interface(two, ["10.0.0.5"], "192.0.2.2") == "eth1"
    assert lanes.default_tcp_interface(two, ["::ffff:7f00:1", "127.0.0.1"], "192.0.2.2") == "eth0"
    assert lanes.default_tcp_interface(two, ["203.0.113.9"], "198.51.100.7") is None
    # only loopback: UCX's own choice
    assert lanes.default_tcp_interface(lo, ["127.0.0.1"], None) is None
    assert lanes.default_tcp_interface({}, [], None) is None


