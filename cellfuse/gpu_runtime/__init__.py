"""Executors of a Plan (numpy, and CUDA through PyCUDA and cuBLAS, loaded lazily) and the benchmark."""
