"""Mooncake connector for sglang. Empty until the sglang connector issue is done; all logic lives in mooncake_core."""
