import gc

import pytest


@pytest.fixture(scope="session")
def cuda():
    """The CUDA device of PyCUDA's context, where CellRNN runs CUDA tensors; skips the test unless PyCUDA,
    nvmath-python, an NVIDIA GPU and a CUDA build of torch are all present."""
    import torch

    from cellfuse.gpu_runtime.cuda_executor import GpuUnavailable, gpu_modules

    try:
        drv = gpu_modules()[0]
    except GpuUnavailable as e:
        pytest.skip(str(e))
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    device = drv.Context.get_device()  # where `auto` measures the rungs
    return next(torch.device("cuda", i) for i in range(drv.Device.count()) if drv.Device(i) == device)


@pytest.fixture
def no_cycle_collector():
    """Python's cycle collector off during the test: what it still frees is held only by cycles."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
