"""SGLang 0.5.23's nixl disaggregation classes (NixlKVManager, sender, receiver, bootstrap server)
with ``SGLANG_DISAGGREGATION_NIXL_BACKEND=MooncakeCore``: prefill and decode in separate
processes move KV pages and metadata rows byte-exact over our NIXL plugin. Same driver
(tests/sglang/peer_pd.py) and byte-for-byte check as the SGLang tests of the mooncake backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from nixl_testkit import make_plugin_env, require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SGL = Path(__file__).resolve().parents[1] / "sglang"


def _sglang_tests():
    """tests/sglang as a package of its own name (pytest may have imported it as `sglang`)."""
    name = "mooncake_sglang_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SGL / "__init__.py", submodule_search_locations=[str(SGL)])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[name] = pkg
        spec.loader.exec_module(pkg)
    return importlib.import_module(f"{name}.conftest"), importlib.import_module(f"{name}.test_sglang_pd")


@pytest.fixture(scope="module")
def sglang_nixl(tmp_path_factory):
    conf, _ = _sglang_tests()
    py = conf.sglang_venv_python()
    if py is None:
        require(f"SGLang venv not found: {conf.INSTALL_HINT}")
    if subprocess.run([py, "-c", "import nixl._api"], capture_output=True, timeout=120).returncode != 0:
        require("nixl is not installed in the SGLang venv (scripts/install_nixl.sh)")
    return py, make_plugin_env(py, tmp_path_factory.mktemp("nixl-plugins-sglang"))


def test_sglang_nixl_backend_moves_pages_byte_exact(sglang_nixl, tmp_path) -> None:
    py, penv = sglang_nixl
    conf, pd = _sglang_tests()
    bport = conf.listen_port()
    env = conf.sglang_env(SGLANG_DISAGGREGATION_NIXL_BACKEND="MooncakeCore", NIXL_PLUGIN_DIR=penv["NIXL_PLUGIN_DIR"],
                          MOONCAKE_LOCAL_HOSTNAME="127.0.0.1")
    p_out, d_out = str(tmp_path / "prefill.npz"), str(tmp_path / "decode.npz")
    peers = []
    try:
        for role, extra in (("prefill", ["--chunks", "2", "--seed", "11", "--out", p_out]),
                            ("decode", ["--seed", "22", "--out", d_out])):
            peers.append(conf.Peer([py, pd.PEER, "--role", role, "--backend", "nixl", *pd._common_args(bport), *extra,
                                    "--deadline", "90"], env, str(tmp_path / f"{role}.log")))
        prefill, decode = peers
        d_res = decode.wait_event("result", 150)
        p_res = prefill.wait_event("result", 60)
        assert d_res["ok"], (d_res, decode.tail())
        assert p_res["ok"], (p_res, prefill.tail())
        # SGLang creates exactly the backend the env names (and fails if it cannot), so these
        # bytes went through MooncakeCore
        pd.assert_pages_moved(p_out, d_out)
    finally:
        for p in peers:
            p.close()
