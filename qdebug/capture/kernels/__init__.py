"""Reduction kernels: every way of turning paired tensors into the sums of docs/metrics.md."""
