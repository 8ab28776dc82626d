"""Fixtures for the NIXL plugin tests: a venv with nixl 1.5.1 and the plugin built from this checkout.

nixl lives in the framework venvs (``scripts/install_vllm.sh --with-nixl`` puts nixl-cu12 in
the vLLM venv, ``SGLANG_WITH_NIXL=1 scripts/install_sglang.sh`` nixl-cu13 in the SGLang one).
The NIXL side of each test runs as a subprocess of such a venv's python. The plugin under test
is compiled from this checkout into a temporary directory which also links every plugin nixl
bundles, and ``NIXL_PLUGIN_DIR`` points there: the tests never depend on (or change) what is
installed in the venv, and UCX & co. stay loadable beside ours. Without a nixl venv the tests
skip, unless ``MOONCAKE_REQUIRE_NIXL=1`` (CI) turns that into a failure.
"""

from __future__ import annotations

import pytest

from nixl_testkit import INSTALL_HINT, make_plugin_env, nixl_python, require


@pytest.fixture(scope="session")
def nixl_py() -> str:
    py = nixl_python()
    if py is None:
        require(f"no python with nixl found: {INSTALL_HINT}")
    return py


@pytest.fixture(scope="session")
def plugin_env(nixl_py: str, tmp_path_factory) -> dict[str, str]:
    return make_plugin_env(nixl_py, tmp_path_factory.mktemp("nixl-plugins"))
