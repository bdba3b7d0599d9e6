import pytest


@pytest.fixture(scope="session")
def gpu():
    """Skips the test unless PyCUDA, nvmath-python and an NVIDIA GPU are all present."""
    from cellfuse.gpu_runtime.cuda_executor import GpuUnavailable, gpu_modules

    try:
        return gpu_modules()
    except GpuUnavailable as e:
        pytest.skip(str(e))
