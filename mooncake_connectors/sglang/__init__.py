"""Mooncake connector for SGLang: SGLang's own Mooncake backends running on ``mooncake_core``.

``plugin.register`` is SGLang's ``sglang.srt.plugins`` entry point (see docs/sglang.md).
"""

from mooncake_connectors.sglang.plugin import register

__all__ = ["register"]
