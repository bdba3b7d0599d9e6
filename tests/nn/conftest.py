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


@pytest.fixture
def settled_memory(cuda, no_cycle_collector):
    """The process's garbage collected and the caching allocator's free blocks given back before the
    test, and no collection during it (`no_cycle_collector`; an explicit one still runs), for tests that
    count the calls that replay: and a call replays only over memory at addresses seen before; blocks
    that the worker's earlier tests freed in the middle of one (by Python's cycle collector) move the
    calls' memory elsewhere, and a lane then leaves them to Python (10 of 16 calls, once in a while,
    among a worker's other tests)."""
    import torch

    gc.collect()
    torch.cuda.synchronize(cuda)
    torch.cuda.empty_cache()
