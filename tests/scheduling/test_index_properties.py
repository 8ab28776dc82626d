"""Property test: the holders index always agrees with each instance's own LRU.

Random sequences of record / remove / clear / capacity changes / instance removal; after each
step, the one-pass ``prefix_hits_all`` and ``best_remote_prefix`` must equal what scanning every
instance separately gives (an independent computation from ``prefix_hit_blocks``).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_proxy.scheduling import ClusterState, InstanceInfo

INSTS = ["p0", "p1", "p2"]
blocks = st.lists(st.integers(0, 12), min_size=0, max_size=8)
op = st.one_of(
    st.tuples(st.just("record"), st.sampled_from(INSTS), blocks),
    st.tuples(st.just("remove"), st.sampled_from(INSTS), blocks),
    st.tuples(st.just("clear"), st.sampled_from(INSTS), st.just([])),
    st.tuples(st.just("cap"), st.sampled_from(INSTS), st.integers(0, 6)),
    st.tuples(st.just("drop"), st.sampled_from(INSTS), st.just([])),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=40), queries=st.lists(blocks, min_size=1, max_size=5),
       caps=st.lists(st.integers(0, 6), min_size=3, max_size=3))
def test_index_matches_per_instance_scan(ops, queries, caps) -> None:
    cl = ClusterState(block_size=1)
    for i, c in zip(INSTS, caps):
        cl.add_instance(InstanceInfo(i, "prefill", cache_capacity_blocks=c))
    for kind, inst, arg in ops:
        if inst not in cl:
            cl.add_instance(InstanceInfo(inst, "prefill", cache_capacity_blocks=2))
        if kind == "record":
            cl.record_blocks(inst, arg)
        elif kind == "remove":
            cl.remove_blocks(inst, arg)
        elif kind == "clear":
            cl.clear_blocks(inst)
        elif kind == "cap":
            cl.add_instance(InstanceInfo(inst, "prefill", cache_capacity_blocks=arg))
        else:
            cl.remove_instance(inst)
        for q in queries:
            scan = {i.instance_id: cl.prefix_hit_blocks(i.instance_id, q) for i in cl.instances("prefill")}
            assert cl.prefix_hits_all(q) == {k: v for k, v in scan.items() if v > 0}
            src, n = cl.best_remote_prefix(q)
            assert n == max(scan.values(), default=0)
            assert (src is None) == (n == 0)
            if src is not None:
                assert scan[src] == n
    for i in cl.instances("prefill"):
        cap = i.cache_capacity_blocks
        assert cap == 0 or cl.cached_block_count(i.instance_id) <= cap
