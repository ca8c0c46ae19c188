"""Benchmarks and load tests for gpualloc (`make bench`, `make loadtest`)."""
