"""cuDNN's persistent RNN algorithms in float32 (or float16), a baseline of their own: torch.nn.LSTM and
torch.nn.GRU never choose CUDNN_RNN_ALGO_PERSIST_STATIC or PERSIST_DYNAMIC for float32 (and
PERSIST_STATIC_SMALL_H only for a small hidden size), so they are called here directly, through cuDNN's C
API (its RNN API: cudnnSetRNNDescriptor_v8, cudnnRNNForward, ...) with ctypes, on the cuDNN that PyTorch
loads, on torch's CUDA tensors and on torch's current stream.

Signatures and enum values are those of cuDNN 9.6.0's headers cudnn_graph.h, cudnn_ops.h and cudnn_adv.h,
unchanged in 9.19.0's (the cuDNN of PyTorch 2.11's CUDA 13 wheels).
PyTorch links libcudnn.so.9, which only dispatches to cuDNN's sub-libraries and loads them when first needed;
each function is taken here from the sub-library whose header declares it (libcudnn_graph.so.9,
libcudnn_ops.so.9, libcudnn_adv.so.9), found beside the libcudnn that the process has mapped.

torch is imported lazily: the module imports on a machine without it, and says what is missing when asked
to run."""

from __future__ import annotations

import ctypes
import functools
import math
import re
import weakref
from collections.abc import Mapping
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint32, c_ulonglong, c_void_p
from pathlib import Path
from typing import Any

import numpy as np

from .torch_baselines import cudnn_gates

# cudnnRNNAlgo_t (cudnn_adv.h)
CUDNN_RNN_ALGO_PERSIST_STATIC = 1
CUDNN_RNN_ALGO_PERSIST_DYNAMIC = 2
CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H = 3

# The benchmark's baselines: one per persistent algorithm
ALGORITHMS = {"cudnn persistent static": CUDNN_RNN_ALGO_PERSIST_STATIC,
              "cudnn persistent dynamic": CUDNN_RNN_ALGO_PERSIST_DYNAMIC,
              "cudnn persistent small h": CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H}
ALGORITHM_NAMES = {CUDNN_RNN_ALGO_PERSIST_STATIC: "CUDNN_RNN_ALGO_PERSIST_STATIC",
                   CUDNN_RNN_ALGO_PERSIST_DYNAMIC: "CUDNN_RNN_ALGO_PERSIST_DYNAMIC",
                   CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H: "CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H"}

_CELL_MODE = {"lstm": 2, "gru": 3}  # cudnnRNNMode_t: CUDNN_LSTM, CUDNN_GRU (cudnn_adv.h)
_DOUBLE_BIAS = 2  # cudnnRNNBiasMode_t CUDNN_RNN_DOUBLE_BIAS: an input and a recurrent bias per gate
_UNIDIRECTIONAL = 0  # cudnnDirectionMode_t CUDNN_UNIDIRECTIONAL
_LINEAR_INPUT = 0  # cudnnRNNInputMode_t CUDNN_LINEAR_INPUT: the first layer multiplies x by its weights
_INFERENCE = 0  # cudnnForwardMode_t CUDNN_FWD_MODE_INFERENCE
_SEQ_MAJOR_UNPACKED = 0  # cudnnRNNDataLayout_t: [T, B, width], the layout of the benchmark's tensors
# auxFlags CUDNN_RNN_PADDED_IO_ENABLED: the unpacked layouts need it (cudnn_adv.h)
_PADDED_IO_ENABLED = 1
_FLOAT, _HALF = 0, 2  # cudnnDataType_t CUDNN_DATA_FLOAT, CUDNN_DATA_HALF (cudnn_graph.h)
# cudnnMathType_t (cudnn_graph.h): in float32 CUDNN_FMA_MATH, float32 arithmetic, no TF32 tensor cores, so
# that the result meets the benchmark's float32 tolerance as every other implementation must; in float16
# CUDNN_TENSOR_OP_MATH, float16 operands on tensor cores, accumulated in float32 (the math precision)
_FMA_MATH, _TENSOR_OP_MATH = 3, 1
_SUCCESS = 0  # cudnnStatus_t CUDNN_STATUS_SUCCESS
_SUBLIBRARIES = ("graph", "ops", "adv")  # each needs the ones before it

_HANDLE = POINTER(c_void_p)  # where a cudnnCreate... call writes the new handle or descriptor
# Every function used, with the sub-library that holds it and its argument types; each returns a
# cudnnStatus_t. Enums are C ints, handles, descriptors and addresses void pointers.
_FUNCTIONS: dict[str, tuple[str, list]] = {
    "cudnnCreate": ("graph", [_HANDLE]),
    "cudnnDestroy": ("graph", [c_void_p]),
    "cudnnSetStream": ("graph", [c_void_p, c_void_p]),
    "cudnnCreateTensorDescriptor": ("ops", [_HANDLE]),
    "cudnnDestroyTensorDescriptor": ("ops", [c_void_p]),
    # (desc, dataType, nbDims, dimA[], strideA[])
    "cudnnSetTensorNdDescriptor": ("ops", [c_void_p, c_int, c_int, POINTER(c_int), POINTER(c_int)]),
    # (desc, nbDimsRequested, *dataType, *nbDims, dimA[], strideA[])
    "cudnnGetTensorNdDescriptor": ("ops", [c_void_p, c_int, POINTER(c_int), POINTER(c_int), POINTER(c_int),
                                           POINTER(c_int)]),
    "cudnnCreateDropoutDescriptor": ("ops", [_HANDLE]),
    "cudnnDestroyDropoutDescriptor": ("ops", [c_void_p]),
    # (desc, handle, float dropout, void *states, size_t stateSizeInBytes, unsigned long long seed)
    "cudnnSetDropoutDescriptor": ("ops", [c_void_p, c_void_p, c_float, c_void_p, c_size_t, c_ulonglong]),
    "cudnnCreateRNNDescriptor": ("adv", [_HANDLE]),
    "cudnnDestroyRNNDescriptor": ("adv", [c_void_p]),
    # (desc, algo, cellMode, biasMode, dirMode, inputMode, dataType, mathPrec, mathType, int32 inputSize,
    #  int32 hiddenSize, int32 projSize, int32 numLayers, dropoutDesc, uint32 auxFlags)
    "cudnnSetRNNDescriptor_v8": ("adv", [c_void_p, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int,
                                         c_int32, c_int32, c_int32, c_int32,
                                         c_void_p, c_uint32]),
    "cudnnBuildRNNDynamic": ("adv", [c_void_p, c_void_p, c_int]),  # (handle, rnnDesc, int miniBatch)
    # (handle, rnnDesc, fwdMode, xDesc, size_t *workSpaceSize, size_t *reserveSpaceSize)
    "cudnnGetRNNTempSpaceSizes": ("adv", [c_void_p, c_void_p, c_int, c_void_p, POINTER(c_size_t),
                                          POINTER(c_size_t)]),
    "cudnnGetRNNWeightSpaceSize": ("adv", [c_void_p, c_void_p, POINTER(c_size_t)]),
    # (handle, rnnDesc, int32 pseudoLayer, size_t weightSpaceSize, weightSpace, int32 linLayerID,
    #  mDesc, void **mAddr, bDesc, void **bAddr)
    "cudnnGetRNNWeightParams": ("adv", [c_void_p, c_void_p, c_int32, c_size_t, c_void_p, c_int32,
                                        c_void_p, POINTER(c_void_p), c_void_p, POINTER(c_void_p)]),
    "cudnnCreateRNNDataDescriptor": ("adv", [_HANDLE]),
    "cudnnDestroyRNNDataDescriptor": ("adv", [c_void_p]),
    # (desc, dataType, layout, int maxSeqLength, int batchSize, int vectorSize, const int seqLengthArray[],
    #  void *paddingFill)
    "cudnnSetRNNDataDescriptor": ("adv", [c_void_p, c_int, c_int, c_int, c_int, c_int, POINTER(c_int),
                                          c_void_p]),
    # (handle, rnnDesc, fwdMode, const int32 devSeqLengths[], xDesc, x, yDesc, y, hDesc, hx, hy, cDesc, cx,
    #  cy, size_t weightSpaceSize, weightSpace, size_t workSpaceSize, workSpace, size_t reserveSpaceSize,
    #  reserveSpace)
    "cudnnRNNForward": ("adv", [c_void_p, c_void_p, c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p]),
}


class CudnnUnavailable(Exception):
    """cuDNN cannot be called here; the message says what is missing."""


class CudnnRefused(Exception):
    """A cuDNN call returned a status other than success: for these algorithms, most often that they do
    not support the sizes asked for. The message names the call and cuDNN's status."""

    def __init__(self, call: str, status: int, status_name: str, detail: str = ""):
        self.call, self.status, self.status_name, self.detail = call, status, status_name, detail
        super().__init__(f"{call} returned {status_name} ({status})" + (f": {detail}" if detail else ""))


def cudnn_weights(kind: str, params: Mapping[str, np.ndarray],
                  layers: int) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """The cell's parameters as cuDNN holds them: (layer, linLayerID) -> (matrix [out, in], bias [out]),
    float32, C-contiguous, for cudnnGetRNNWeightParams to place.

    With G gates, linLayerIDs 0..G-1 are the gates' input matrices and biases and G..2G-1 their recurrent
    ones, the gates in cuDNN's order (see `cudnn_gates`: i, f, g, o for the LSTM; r, z, n for the GRU), as
    PyTorch's cuDNN RNN (aten/src/ATen/native/cudnn/RNN.cpp) lays out weight_ih and weight_hh."""
    placed: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for layer in range(layers):
        gates = cudnn_gates(kind, params, layer)
        for g, (w_in, w_rec, b_in, b_rec) in enumerate(gates):
            placed[layer, g] = (np.ascontiguousarray(w_in, np.float32), np.asarray(b_in, np.float32))
            placed[layer, len(gates) + g] = (np.ascontiguousarray(w_rec, np.float32),
                                             np.asarray(b_rec, np.float32))
    return placed


def find_libraries(maps: str) -> dict[str, Path]:
    """The files of cuDNN 9's sub-libraries for this process, from the text of /proc/self/maps: each one the
    process has mapped, else the one beside the mapped libcudnn (which loads its sub-libraries only when
    first needed)."""
    mapped: dict[str, Path] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path = Path(fields[5].strip())
        found = re.fullmatch(r"libcudnn(?:_(\w+?))?\.so\.9(?:\.[0-9.]+)?", path.name)
        if found:
            mapped.setdefault(found.group(1) or "", path)
    if not mapped:
        raise CudnnUnavailable("PyTorch's cuDNN is not a shared library libcudnn.so.9 that this process has "
                               "mapped (none in /proc/self/maps after torch.backends.cudnn.version())")
    folders = list(dict.fromkeys(p.parent for p in mapped.values()))
    libraries = {}
    for sub in _SUBLIBRARIES:
        beside = (folder / f"libcudnn_{sub}.so.9" for folder in folders)
        path = mapped.get(sub) or next((p for p in beside if p.exists()), None)
        if path is None:
            raise CudnnUnavailable(f"cuDNN's library libcudnn_{sub}.so.9 is not loaded and not in "
                                   f"{' or '.join(map(str, folders))}, beside the cuDNN that PyTorch loaded")
        libraries[sub] = path
    return libraries


class Cudnn:
    """cuDNN's functions used here, their ctypes types set; calling one raises CudnnRefused with cuDNN's
    status name (cudnnGetErrorString) and last error message unless it succeeds."""

    def __init__(self, libraries: Mapping[str, Any], version: int):
        self.version = version
        self.functions = {}
        for name, (sub, argtypes) in _FUNCTIONS.items():
            try:
                fn = getattr(libraries[sub], name)
            except AttributeError:
                where = _library_name(libraries[sub], sub)
                raise CudnnUnavailable(f"cuDNN's {name} is missing from {where}, cuDNN {version}") from None
            fn.argtypes, fn.restype = argtypes, c_int
            self.functions[name] = fn
        self._error_string = libraries["graph"].cudnnGetErrorString
        self._error_string.argtypes, self._error_string.restype = [c_int], c_char_p
        # cudnnGetLastErrorString(char *message, size_t max_size), cuDNN's detail on the last failure
        self._last_error = getattr(libraries["graph"], "cudnnGetLastErrorString", None)
        if self._last_error is not None:
            self._last_error.argtypes, self._last_error.restype = [c_char_p, c_size_t], None

    def __call__(self, name: str, *args) -> None:
        status = self.functions[name](*args)
        if status != _SUCCESS:
            raise CudnnRefused(name, status, self.status_name(status), self.last_error())

    def status_name(self, status: int) -> str:
        text = self._error_string(status)
        return text.decode(errors="replace") if text else f"cudnnStatus_t {status}"

    def last_error(self) -> str:
        if self._last_error is None:
            return ""
        buffer = ctypes.create_string_buffer(1024)
        self._last_error(buffer, len(buffer))
        return " ".join(buffer.value.decode(errors="replace").split())


def _library_name(library: Any, sub: str) -> str:
    return getattr(library, "_name", None) or f"libcudnn_{sub}.so.9"


@functools.cache
def load_cudnn() -> Cudnn:
    """The cuDNN 9 that PyTorch loaded, or CudnnUnavailable saying what is missing."""
    try:
        import torch
    except ImportError:
        raise CudnnUnavailable("PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise CudnnUnavailable("PyTorch sees no CUDA GPU")
    if not torch.backends.cudnn.is_available():
        raise CudnnUnavailable("this PyTorch was built without cuDNN")
    version = torch.backends.cudnn.version()  # loads libcudnn
    if version is None or version < 90000:
        raise CudnnUnavailable(f"PyTorch's cuDNN is version {version}; this baseline calls cuDNN 9's RNN "
                               "library libcudnn_adv.so.9")
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError as e:
        raise CudnnUnavailable(f"cannot find PyTorch's cuDNN: /proc/self/maps cannot be read ({e})") from None
    libraries = {}
    for sub, path in find_libraries(maps).items():  # in dependency order, so that each finds the ones before
        try:
            libraries[sub] = ctypes.CDLL(str(path))
        except OSError as e:
            raise CudnnUnavailable(f"cannot load {path}: {e}") from None
    return Cudnn(libraries, version)


def unavailable_reason() -> str | None:
    """Why cuDNN's persistent algorithms cannot run here, or None when they can be tried."""
    try:
        load_cudnn()
    except CudnnUnavailable as e:
        return str(e)
    return None


def _release(cudnn: Cudnn, owned: list[tuple[str, c_void_p]]) -> None:
    """Destroys what a CudnnPersistentRNN created, the last first; a status here has nobody to go to."""
    while owned:
        destroy, handle = owned.pop()
        cudnn.functions[destroy](handle)


class CudnnPersistentRNN:
    """The cell (an LSTM or a torch-style GRU, see cudnn_kind) as one cuDNN RNN of all its layers with the
    cell's weights, built for one persistent algorithm and one problem size, and run by cudnnRNNForward in
    inference mode on torch's CUDA tensors, on torch's current stream.

    With `half`, x, the weights, y and the states are float16 and the GEMMs run on tensor cores,
    accumulating in float32 (cuDNN's RNN in 16 bits, as PyTorch's float16 RNN runs it).

    Raises CudnnUnavailable when cuDNN cannot be called here, and CudnnRefused when cuDNN refuses the
    algorithm or the sizes, here or in the first call."""

    def __init__(self, kind: str, params: Mapping[str, np.ndarray], layers: int, input_size: int, hidden: int,
                 batch: int, seq: int, algo: int, half: bool = False):
        cudnn = load_cudnn()
        import torch

        self.torch, self.cudnn, self.kind, self.algo = torch, cudnn, kind, algo
        self.data_type = _HALF if half else _FLOAT
        self.dtype, self.host_dtype = (torch.float16, np.float16) if half else (torch.float32, np.float32)
        self.shape_x, self.shape_state = (seq, batch, input_size), (layers, batch, hidden)
        self._owned: list[tuple[str, c_void_p]] = []
        self._finalizer = weakref.finalize(self, _release, cudnn, self._owned)
        self._finalizer.atexit = False  # at exit the process's end frees it all; CUDA may be gone by then
        self.handle = self._new("cudnnCreate", "cudnnDestroy")
        cudnn("cudnnSetStream", self.handle, torch.cuda.current_stream().cuda_stream)
        dropout = self._new("cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor")
        cudnn("cudnnSetDropoutDescriptor", dropout, self.handle, 0.0, None, 0, 0)  # no dropout: no states
        self.rnn = self._new("cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor")
        cudnn("cudnnSetRNNDescriptor_v8", self.rnn, algo, _CELL_MODE[kind], _DOUBLE_BIAS, _UNIDIRECTIONAL,
              _LINEAR_INPUT, self.data_type, _FLOAT, _TENSOR_OP_MATH if half else _FMA_MATH, input_size,
              hidden, hidden, layers, dropout, _PADDED_IO_ENABLED)
        if algo == CUDNN_RNN_ALGO_PERSIST_DYNAMIC:  # compiles its kernel for this batch size, with NVRTC
            cudnn("cudnnBuildRNNDynamic", self.handle, self.rnn, batch)
        self.x_desc = self._sequence(seq, batch, input_size)
        self.y_desc = self._sequence(seq, batch, hidden)
        self.state_desc = self._tensor(self.shape_state)
        self._load_weights(kind, params, layers)
        work, reserve = c_size_t(), c_size_t()
        cudnn("cudnnGetRNNTempSpaceSizes", self.handle, self.rnn, _INFERENCE, self.x_desc, ctypes.byref(work),
              ctypes.byref(reserve))
        cuda = {"device": "cuda"}
        self.workspace = torch.empty(max(work.value, 1), dtype=torch.uint8, **cuda)
        self.seq_lengths = torch.full((batch,), seq, dtype=torch.int32, **cuda)  # read by the GPU
        self.y = torch.empty(seq, batch, hidden, dtype=self.dtype, **cuda)
        self.final = tuple(torch.empty(self.shape_state, dtype=self.dtype, **cuda)
                           for _ in range(2 if kind == "lstm" else 1))  # (h,) or (h, c): the cell's states

    def _new(self, create: str, destroy: str) -> c_void_p:
        handle = c_void_p()
        self.cudnn(create, ctypes.byref(handle))
        self._owned.append((destroy, handle))
        return handle

    def _tensor(self, shape: tuple[int, ...]) -> c_void_p:
        desc = self._new("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]  # row-major
        self.cudnn("cudnnSetTensorNdDescriptor", desc, self.data_type, len(shape),
                   (c_int * len(shape))(*shape), (c_int * len(shape))(*strides))
        return desc

    def _sequence(self, seq: int, batch: int, width: int) -> c_void_p:
        desc = self._new("cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor")
        lengths = (c_int * batch)(*[seq] * batch)  # every sequence runs all T steps
        self.cudnn("cudnnSetRNNDataDescriptor", desc, self.data_type, _SEQ_MAJOR_UNPACKED, seq, batch, width,
                   lengths, None)
        return desc

    def _dims(self, desc: c_void_p) -> tuple[int, ...]:
        data_type, count = c_int(), c_int()
        dims, strides = (c_int * 3)(), (c_int * 3)()
        self.cudnn("cudnnGetTensorNdDescriptor", desc, 3, ctypes.byref(data_type), ctypes.byref(count), dims,
                   strides)
        return tuple(dims[:min(count.value, 3)])

    def _load_weights(self, kind: str, params: Mapping[str, np.ndarray], layers: int) -> None:
        """Asks cuDNN where each matrix and bias lives in its weight space, and puts the cell's there."""
        torch, cudnn = self.torch, self.cudnn
        size = c_size_t()
        cudnn("cudnnGetRNNWeightSpaceSize", self.handle, self.rnn, ctypes.byref(size))
        self.weight_bytes = size.value
        itemsize = np.dtype(self.host_dtype).itemsize
        self.weights = torch.empty(size.value // itemsize, dtype=self.dtype, device="cuda")
        base = self.weights.data_ptr()
        host = np.zeros(size.value // itemsize, self.host_dtype)
        matrix_desc = self._tensor((1, 1, 1))  # overwritten with each matrix's shape by cuDNN
        bias_desc = self._tensor((1, 1, 1))
        for (layer, lin_id), (matrix, bias) in cudnn_weights(kind, params, layers).items():
            matrix_at, bias_at = c_void_p(), c_void_p()
            cudnn("cudnnGetRNNWeightParams", self.handle, self.rnn, layer, size.value, base, lin_id,
                  matrix_desc, ctypes.byref(matrix_at), bias_desc, ctypes.byref(bias_at))
            for what, at, desc, value in (("matrix", matrix_at, matrix_desc, matrix),
                                          ("bias", bias_at, bias_desc, bias)):
                self._place(host, base, at.value, self._dims(desc), value, f"{what} of layer {layer}, "
                            f"linLayerID {lin_id}")
        self.weights.copy_(torch.from_numpy(host))

    @staticmethod
    def _place(host: np.ndarray, base: int, at: int | None, dims: tuple[int, ...], value: np.ndarray,
               what: str) -> None:
        """Writes `value` where cuDNN says it lives: `at` in the weight space that starts at `base`, with
        cuDNN's shape `dims` ([1, out, in] for a matrix, [1, out, 1] for a bias), in host's type."""
        start = ((at or 0) - base) // host.itemsize
        fits = at is not None and 0 <= start and start + value.size <= host.size
        if not fits or math.prod(dims) != value.size or (value.ndim == 2 and dims[1:] != value.shape):
            raise RuntimeError(f"cuDNN's {what} has shape {dims} at element {start} of {host.size}; the "
                               f"cell's is {value.shape}")
        host[start:start + value.size] = value.ravel()

    def __call__(self, x, initial: list | None = None):
        """x: [T, B, input], float32 (float16 with `half`), contiguous on the GPU; initial: the cell's
        initial states ([h] for the GRU, [h, c] for the LSTM, each [L, B, H]), or None for zeros. Returns
        y [T, B, H], a buffer that the next call overwrites; the final states are in `final`."""
        torch = self.torch
        self._check("x", x, self.shape_x)
        starts = [None] * len(self.final)
        if initial is not None:
            if len(initial) != len(self.final):
                raise ValueError(f"the {self.kind} has {len(self.final)} states, {len(initial)} initial "
                                 "values given")
            for i, s in enumerate(initial):
                self._check(f"initial state {i}", s, self.shape_state)
                starts[i] = s.data_ptr()
        cx, cy = (starts[1], self.final[1].data_ptr()) if self.kind == "lstm" else (None, None)
        cudnn = self.cudnn
        cudnn("cudnnSetStream", self.handle, torch.cuda.current_stream().cuda_stream)
        cudnn("cudnnRNNForward", self.handle, self.rnn, _INFERENCE, self.seq_lengths.data_ptr(),
              self.x_desc, x.data_ptr(), self.y_desc, self.y.data_ptr(),
              self.state_desc, starts[0], self.final[0].data_ptr(), self.state_desc, cx, cy,
              self.weight_bytes, self.weights.data_ptr(), self.workspace.numel(), self.workspace.data_ptr(),
              0, None)  # no reserve space in inference
        return self.y

    def _check(self, what: str, t, shape: tuple[int, ...]) -> None:
        if tuple(t.shape) != shape or t.dtype != self.dtype or not t.is_cuda or not t.is_contiguous():
            raise ValueError(f"{what}: expected a contiguous {self.dtype} CUDA tensor of shape "
                             f"{list(shape)}, got {t.dtype} {list(t.shape)} on {t.device}"
                             + ("" if t.is_contiguous() else ", not contiguous"))

    def close(self) -> None:
        """Destroys cuDNN's handle and descriptors now rather than when the object is collected."""
        self._finalizer()
