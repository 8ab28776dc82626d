"""GPU memory benches (need a CUDA GPU): transfers between device buffers, the copy call's own cost."""
