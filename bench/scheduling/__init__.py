"""Scheduling benches: the simulator on the paper's traces, live scheduling on vLLM engines, the proxy's store view."""
