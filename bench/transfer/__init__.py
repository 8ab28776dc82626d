"""Transfer Engine benches: throughput and latency against the original's TE, batch submission, copy threads."""
