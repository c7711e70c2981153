"""Developer tools: benchmarks and clients (not installed with the package)."""
