"""Mooncake connector for lmcache. Empty until the lmcache connector issue is done; all logic lives in mooncake_core."""
