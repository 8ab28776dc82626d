"""Thin adapters that plug mooncake_core into serving frameworks (vLLM, SGLang, LMDeploy, LMCache, NIXL)."""
