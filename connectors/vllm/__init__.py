"""Mooncake connector for vllm. Empty until the vllm connector issue is done; all logic lives in mooncake_core."""
