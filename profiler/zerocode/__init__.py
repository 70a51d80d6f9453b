"""Zero-code profiling: an unmodified process recorded from outside, and its ranks' estimated figures."""
