"""Mooncake connector for nixl. Empty until the nixl connector issue is done; all logic lives in mooncake_core."""
