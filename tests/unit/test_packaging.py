"""Every package directory must be listed in pyproject.toml, or a wheel install misses it."""

from __future__ import annotations

import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # requires-python is 3.10: tomllib is 3.11+, its backport comes with the test extra
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_all_package_dirs_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(cfg["tool"]["setuptools"]["packages"])
    assert "package-dir" not in cfg["tool"]["setuptools"], "folders are named as their packages"
    missing = []
    for import_name in sorted(n for n in listed if "." not in n):
        base = ROOT / import_name
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            name = ".".join((import_name, *rel.parts)) if rel.parts else import_name
            if name not in listed:
                missing.append(name)
    assert not missing, f"add these packages to [tool.setuptools].packages in pyproject.toml: {missing}"


def test_connector_packages_import() -> None:
    import importlib

    for name in ("vllm", "sglang", "lmdeploy", "lmcache", "nixl"):
        importlib.import_module(f"mooncake_connectors.{name}")
    importlib.import_module("mooncake_proxy")


def test_parse_size() -> None:
    import pytest

    from mooncake_core.utils.sizes import parse_size

    assert parse_size("1 GB") == 1 << 30
    assert parse_size("512MB") == 512 << 20
    assert parse_size(4096) == 4096
    assert parse_size("1.5 KiB") == 1536
    for bad in ("50%", "abc", "-1", "1 XB", True, None):
        with pytest.raises(ValueError):
            parse_size(bad)  # type: ignore[arg-type]
