"""The plugin manager in-process: built-ins are plugins, third-party plugins extend every
registry (transports, metadata schemes, hand-offs, policies), duplicate names are refused."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from mooncake_core.metadata import open_metadata, parse_conn_string
from mooncake_core.metadata.conn_string import MetadataSpec
from mooncake_core.plugins import (MetadataBackendPlugin, NamedFactory, PluginError, get_plugin_manager,
                                   hookimpl, metadata_backends, transport_classes)
from mooncake_core.transfer.base import Transport
from mooncake_proxy.handoff import VllmHandoff, make_handoff
from mooncake_proxy.scheduling import ClusterState, make_scheduler, policy_names
from mooncake_proxy.scheduling.policies import RoundRobinScheduler


@pytest.fixture
def register() -> Iterator[Any]:
    pm = get_plugin_manager()
    added: list[object] = []

    def add(plugin: object, name: str) -> None:
        pm.register(plugin, name=name)
        added.append(plugin)

    yield add
    for p in added:
        pm.unregister(p)


def test_builtins_are_plugins_in_priority_order() -> None:
    names = [c.name for c in transport_classes()]
    assert names == ["local", "cma", "ucx", "tcp"]
    pm = get_plugin_manager()
    for n in ("mooncake_core.transport.tcp", "mooncake_core.metadata.etcd"):
        assert pm.get_plugin(n) is not None
    assert {"http", "https", "etcd", "redis"} <= set(metadata_backends())


def test_duplicate_transport_name_names_both_plugins(register) -> None:
    class FakeTcp(Transport):
        name = "tcp"

        def can_reach(self, desc: Any) -> bool:
            return False

        def transfer(self, desc: Any, reqs: Any, deadline: float) -> None:
            raise AssertionError

    class Dup:
        @hookimpl
        def mooncake_transports(self) -> list[type[Transport]]:
            return [FakeTcp]

    register(Dup(), "dup-tcp")
    with pytest.raises(PluginError, match="'tcp' is provided by both plugin 'mooncake_core.transport.tcp' and "
                                          "plugin 'dup-tcp'"):
        transport_classes()


def test_metadata_scheme_plugin_parses_and_opens(register) -> None:
    opened: list[Any] = []

    def parse(conn: str, env: Any) -> MetadataSpec:
        return MetadataSpec(kind="memkv", endpoints=(("here", 1),))

    def open_(spec: Any, timeout: float) -> Any:
        opened.append((spec, timeout))
        return "backend"

    class Mem:
        @hookimpl
        def mooncake_metadata_backends(self) -> list[MetadataBackendPlugin]:
            return [MetadataBackendPlugin(("memkv",), parse, open_, "memkv://name")]

    register(Mem(), "memkv")
    assert parse_conn_string("memkv://x").kind == "memkv"
    assert open_metadata("MEMKV://x", timeout=2.5) == "backend"
    assert opened[0][1] == 2.5
    with pytest.raises(ValueError, match="memkv://name"):  # listed among the accepted forms
        open_metadata("nosuch://x")


def test_handoff_and_policy_plugins(register) -> None:
    class Echo(VllmHandoff):
        name = "echo"

    class Fair(RoundRobinScheduler):
        policy = "fair"

    class Proxyish:
        @hookimpl
        def mooncake_handoff_protocols(self) -> list[NamedFactory]:
            return [NamedFactory("echo", Echo)]

        @hookimpl
        def mooncake_scheduler_policies(self) -> list[NamedFactory]:
            return [NamedFactory("fair", Fair)]

    register(Proxyish(), "proxyish")
    assert isinstance(make_handoff("echo"), Echo)
    assert isinstance(make_scheduler("fair", ClusterState(block_size=16)), Fair)
    assert policy_names()[-1] == "fair" and policy_names()[0] == "random"
    with pytest.raises(ValueError, match="'echo'"):  # the error lists plugin names too
        make_handoff("nope")


def test_plugin_building_the_wrong_type_is_refused(register) -> None:
    class Bad:
        @hookimpl
        def mooncake_handoff_protocols(self) -> list[NamedFactory]:
            return [NamedFactory("bad", dict)]

    register(Bad(), "bad")
    with pytest.raises(TypeError, match="not a HandoffProtocol"):
        make_handoff("bad")


def test_policy_plugins_get_the_proxys_scheduler_settings_when_they_take_them(register) -> None:
    """A Scheduler subclass gets non-default settings and the calibration's latency board; a
    factory that takes neither still builds with the defaults, and is refused -- naming the
    keywords -- when the proxy needs them."""
    from mooncake_proxy.scheduling import CostModel, HardwareGroups, LatencyBoard, LatencyModel, SchedulerSettings

    class Fair(RoundRobinScheduler):
        policy = "fair"

    def plain(cluster, cost, slo, seed):  # an older plugin's factory
        return RoundRobinScheduler(cluster, cost, slo, seed)

    class Policies:
        @hookimpl
        def mooncake_scheduler_policies(self) -> list[NamedFactory]:
            return [NamedFactory("fair", Fair), NamedFactory("plain", plain)]

    register(Policies(), "policies")
    cl = ClusterState(block_size=16)
    board = LatencyBoard(LatencyModel(CostModel.default(), contention_slope=0.5))
    s = make_scheduler("fair", cl, settings=SchedulerSettings(prefill_batch_tokens=64), latency=board)
    assert s.prefill_batch_tokens == 64 and s.contention_slope == 0.5
    board.publish(LatencyModel(CostModel.default(), contention_slope=0.25))
    assert s.contention_slope == 0.25  # the scheduler reads what is published
    assert isinstance(make_scheduler("plain", cl, settings=SchedulerSettings()), RoundRobinScheduler)
    with pytest.raises(ValueError, match="'plain'.*settings / latency"):
        make_scheduler("plain", cl, settings=SchedulerSettings(hardware_groups=HardwareGroups([["p0", "p1"]])),
                       latency=board)
