"""Mooncake connector for lmdeploy. Empty until the lmdeploy connector issue is done; all logic lives in mooncake_core."""
