"""Framework benches: vLLM PD, SGLang, NIXL, LMDeploy and LMCache hand-offs against the original Mooncake."""
