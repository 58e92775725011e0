"""Mixed precision: suggest what to promote, promote to 16-bit, re-quantize, compare and search."""
