"""Fuzz drivers shared by tests/fuzz (a few hundred inputs per surface) and bench/robustness/bench_fuzz.py
(a million): the surfaces, the TE target process and the vLLM ``kv_transfer_params`` checks."""
