// A module's kept inference call on a GPU, made in C++: a `Lane` checks that a call is like the one it
// was made from, takes the call's memory from torch's caching allocator, finds the CUDA graph its
// program captured over that memory, and replays it on the caller's stream, all without Python.
//
// Why: the Python that decides and checks a call costs 40 to 90 us of host time a call, more than the
// GPU takes for a small batch (docs/results/2026-11-29-cellrnn-kept-runs.md); done here it costs a few.
//
// A lane is made by cellfuse/nn/quick_lane.py after a call that its Python made (a replay of a kept run
// of CudaRunner's forward program), and answers None for any call it cannot make exactly as that Python
// would, which then makes it. What it checks, each call:
//   - x: a torch.Tensor (not a subclass) of the shape, dtype and device the lane was made for; no
//     gradient mode; no CUDA autocast where x is float32; the device current, and its driver context;
//   - the parameters: the same tensor objects (held weakly, so that a new one cannot take a freed one's
//     place), at the same addresses, of the same dtypes and at the same versions as when they were
//     packed (a change in place bumps the version: then Python packs them again);
//   - the states: none (the kept zeros) or every one, each of the lane's shape, device and type (the
//     plan's: that of its zeros), contiguous and at a 16-byte address;
//   - the stream: the one its run was put on, not capturing;
//   - the locks the runner and its program hold around a run, both free (another thread's run is not
//     half on a stream);
//   - the count of changes (`changes.value`) as when it was made: Python counts every change to what a
//     lane depends on (another stream's run, a packing made or dropped, a captured run released);
//   - the bases of the run (the memory's addresses) those of a captured run it learned.
// The replay is counted on the program (`_replays`), as Python's are, for its thrash guard.
//
// The call's memory is of the type the plan stores y and the states in (`out_dtype`, its zeros'): where
// that is not x's (a 16-bit plan that keeps them float32), y and the final states are given back
// converted to x's type, in one copy of the outputs after the replay, as CudaRunner's Python does.
//
// A lane made with `rows` also makes the kept calls of a PackedSequence (`packed`, with no initial
// states): it pads the packed data into x and writes the steps-left state of the cell that runs each row
// to its own length by one launch of codegen/packed_rows.py's cf_unpack_rows (the batch sizes in its
// arguments), then replays the run over them; Python packs y back. It checks the batch sizes too: on the
// CPU, int64, at most `capacity` of them, their steps rounded up to STEPS_MULTIPLE x's, the first B,
// none larger than the one before, none below 1, summing to the data's rows.
//
// `Rows` (at the end) launches the padding and packing kernels of a PackedSequence's rows for the calls a
// lane does not make, in the same way, and the zeroing of the padding of rows of lengths of their own.
//
// It is built by nvcc (as a host-only C++ file) against the headers of the torch the process runs, kept
// in the kernel cache folder per torch version, and loaded as a Python extension module.
#include <torch/csrc/autograd/python_variable.h>

#include <ATen/ops/empty_ops.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>

#include <structmember.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace {

// the driver's entry points, given by the caller (nothing of CUDA's is linked): handles as pointers
typedef int (*GraphLaunch)(void*, void*);          // cuGraphLaunch(graph, stream)
typedef int (*StreamIsCapturing)(void*, int*);     // cuStreamIsCapturing(stream, &status)
typedef int (*CtxGetCurrent)(void**);              // cuCtxGetCurrent(&context)
typedef int (*LaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            void*, void**, void**);  // cuLaunchKernel

constexpr size_t MAX_KEPT = 8;  // captured runs a lane knows (StreamProgram keeps as many)
constexpr int64_t STEPS_MULTIPLE = 4;  // a PackedSequence's steps are run in multiples of this
constexpr unsigned BLOCK = 256;  // threads per block of cf_unpack_rows (codegen/kernel_abi.py)

// the head of cf_unpack_rows's arguments (codegen/packed_rows.py's args_fields); the batch sizes follow,
// then their offsets, `capacity` ints each
struct RowsHead {
  uint64_t src, dst, steps;
  int64_t elements, steps_elements;
  int32_t T, B, W, H;
};
static_assert(sizeof(RowsHead) == 56, "cf_rows_args' head is 56 bytes");

// the head of cf_zero_rows's and cf_reverse_rows's arguments (codegen/packed_rows.py's
// lengths_args_fields); the rows' lengths follow, `capacity` ints
struct LengthsHead {
  uint64_t src, dst, steps;
  int64_t t_stride, b_stride, steps_elements;
  int32_t T, B, W, H;
};
static_assert(sizeof(LengthsHead) == 64, "cf_lengths_args' head is 64 bytes");

struct Param {
  c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  const void* data;
  c10::ScalarType dtype;
  uint32_t version;
};

struct Kept {
  std::vector<uint64_t> bases;
  uint64_t graph;
};

struct Core {
  std::vector<int64_t> x_sizes;
  c10::ScalarType dtype;      // x's, and that of y and the final states given back
  c10::ScalarType out_dtype;  // that of the call's memory, its states and its zeros (the plan's)
  c10::Device device{c10::kCPU};
  bool batch_first = false;
  std::vector<Param> params;
  std::vector<at::Tensor> zeros;  // the initial states of a call that gives none, of out_dtype
  std::vector<int64_t> state_sizes;
  int64_t T = 0, B = 0, H = 0, L = 0;
  int64_t block_elements = 0, outputs_end = 0;  // the call's one piece of memory, in elements
  std::vector<int64_t> finals_at;
  uint64_t packed = 0, stream = 0, context = 0;
  PyObject* changes = nullptr;  // an object whose `value` counts the changes (a new reference)
  long long changes_seen = 0;
  PyObject* locks[2] = {nullptr, nullptr};
  PyObject* program = nullptr;
  GraphLaunch launch = nullptr;
  StreamIsCapturing capturing = nullptr;
  CtxGetCurrent current_context = nullptr;
  LaunchKernel launch_kernel = nullptr;
  void* unpack = nullptr;  // cf_unpack_rows, where the lane makes a PackedSequence's calls
  int64_t capacity = 0, grid = 0;  // (the steps its arguments hold; its blocks)
  std::vector<Kept> kept;  // the oldest first
  std::vector<uint64_t> missed;  // the bases of the last call whose run it did not know

  Core() = default;
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core() {  // (the references it holds; a lane goes with the GIL held)
    Py_XDECREF(changes);
    Py_XDECREF(locks[0]);
    Py_XDECREF(locks[1]);
    Py_XDECREF(program);
  }
};

struct Lane {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  Core* core;
};

PyObject* value_name = nullptr;  // "value", interned
PyObject* acquire_name = nullptr;
PyObject* release_name = nullptr;
PyObject* replays_name = nullptr;
PyObject* one = nullptr;

bool is_tensor(PyObject* o) { return THPVariable_CheckExact(o); }

// a stream's handle given as a Python int: false (a Python error set) where it is not one
bool stream_arg(PyObject* o, uint64_t& out) {
  out = PyLong_AsUnsignedLongLong(o);
  return !(out == (uint64_t)-1 && PyErr_Occurred());
}

// what `make` answers, or None where it throws (out of memory, say: Python's path then raises it as torch
// does; where the exception was a Python error's, that error cleared)
template <class Make>
PyObject* none_where_it_throws(Make make) {
  try {
    return make();
  } catch (const std::exception&) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
}

// memory from torch's caching allocator, on the current stream
at::Tensor empty(c10::IntArrayRef shape, c10::ScalarType dtype, c10::Device device) {
  return at::_ops::empty_memory_format::call(c10::fromIntArrayRefSlow(shape), dtype, std::nullopt, device,
                                             std::nullopt, std::nullopt);
}

bool current(const Core& c) {
  PyObject* v = PyObject_GetAttr(c.changes, value_name);
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  long long n = PyLong_AsLongLong(v);
  Py_DECREF(v);
  if (n == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return n == c.changes_seen;
}

// the runner's and the program's locks, taken without waiting, and given back when it goes
class Turn {
 public:
  explicit Turn(const Core& c) : c_(c) {
    for (int i = 0; i < 2; ++i) {
      PyObject* r = PyObject_CallMethodOneArg(c.locks[i], acquire_name, Py_False);
      bool got = r == Py_True;
      Py_XDECREF(r);
      if (r == nullptr) PyErr_Clear();
      if (!got) return;
      held_ = i + 1;
    }
  }
  ~Turn() {
    for (int i = held_ - 1; i >= 0; --i) {
      PyObject* r = PyObject_CallMethodNoArgs(c_.locks[i], release_name);
      if (r == nullptr) PyErr_Clear();
      Py_XDECREF(r);
    }
  }
  bool ok() const { return held_ == 2; }

 private:
  const Core& c_;
  int held_ = 0;
};

bool params_match(const Core& c, PyObject* list) {
  if (!PyList_Check(list) || (size_t)PyList_GET_SIZE(list) != c.params.size()) return false;
  for (size_t i = 0; i < c.params.size(); ++i) {
    PyObject* o = PyList_GET_ITEM(list, i);
    if (!is_tensor(o)) return false;
    const at::Tensor& p = THPVariable_Unpack(o);
    c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    const Param& want = c.params[i];
    if (impl != want.impl._unsafe_get_target() || impl->is_inference() || impl->data() != want.data ||
        p.scalar_type() != want.dtype || impl->version_counter().current_version() != want.version)
      return false;
  }
  return true;
}

bool in_place(const at::Tensor& t) {
  return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// the states' addresses where they are as a call must give them (or the zeros where none are)
bool states_of(const Core& c, PyObject* states, std::vector<uint64_t>& out) {
  if (states == Py_None) {
    for (const at::Tensor& z : c.zeros) out.push_back(reinterpret_cast<uint64_t>(z.data_ptr()));
    return true;
  }
  if (!PyList_CheckExact(states) || (size_t)PyList_GET_SIZE(states) != c.zeros.size()) return false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(states); ++i) {
    PyObject* o = PyList_GET_ITEM(states, i);
    if (!is_tensor(o)) return false;
    const at::Tensor& s = THPVariable_Unpack(o);
    if (s.sizes() != c10::IntArrayRef(c.state_sizes) || s.scalar_type() != c.out_dtype ||
        s.device() != c.device || !in_place(s))
      return false;
    out.push_back(reinterpret_cast<uint64_t>(s.data_ptr()));
  }
  return true;
}

// whether `device` is the current one (where it is a GPU), and `context` the driver's current context
bool device_current(c10::Device device, uint64_t context, CtxGetCurrent current_context) {
  if (device.is_cuda() &&
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device.index())
    return false;
  void* now = nullptr;
  return current_context(&now) == 0 && reinterpret_cast<uint64_t>(now) == context;
}

bool device_ready(const Core& c) {
  if (!device_current(c.device, c.context, c.current_context)) return false;
  int status = 0;
  return c.capturing(reinterpret_cast<void*>(c.stream), &status) == 0 && status == 0;
}

const Kept* find(const Core& c, const std::vector<uint64_t>& bases) {
  for (const Kept& k : c.kept)
    if (k.bases == bases) return &k;
  return nullptr;
}

void count_replay(const Core& c) {
  PyObject* n = PyObject_GetAttr(c.program, replays_name);
  PyObject* more = n ? PyNumber_Add(n, one) : nullptr;
  if (more == nullptr || PyObject_SetAttr(c.program, replays_name, more) != 0) PyErr_Clear();
  Py_XDECREF(n);
  Py_XDECREF(more);
}

// whether a call on this stream, of these parameters, may be made here (what x aside)
bool may_call(const Core& c, PyObject* params, uint64_t stream) {
  if (stream != c.stream || c10::GradMode::is_enabled()) return false;
  // (torch.autocast changes float32 inputs only; enabled where its key is not excluded)
  if (c.dtype == c10::ScalarType::Float &&
      !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::AutocastCUDA))
    return false;
  return params_match(c, params) && device_ready(c);
}

PyObject* replay(Core& c, const at::Tensor& x, const std::vector<uint64_t>& state_at,
                 const std::vector<uint8_t>* unpack_args);

// (y, [final states]) of a call made here, or None where the call is not one this lane makes
PyObject* call(Lane* self, PyObject* x_obj, PyObject* params, PyObject* states, uint64_t stream) {
  Core& c = *self->core;
  if (!is_tensor(x_obj)) Py_RETURN_NONE;
  at::Tensor x = THPVariable_Unpack(x_obj);
  if (x.sizes() != c10::IntArrayRef(c.x_sizes) || x.scalar_type() != c.dtype || x.device() != c.device)
    Py_RETURN_NONE;
  if (!may_call(c, params, stream)) Py_RETURN_NONE;
  std::vector<uint64_t> state_at;
  if (!states_of(c, states, state_at)) Py_RETURN_NONE;
  if (c.batch_first) x = x.transpose(0, 1);
  if (!x.is_contiguous()) x = x.contiguous();  // (as the runner's _in_place copies it)
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16) Py_RETURN_NONE;
  return replay(c, x, state_at, nullptr);
}

// the rows of a PackedSequence of these batch sizes (their sum), or -1 where they are not ones the packed
// rows' kernels take: on the CPU, int64, 1 to `capacity` of them, none below 1, none larger than the one
// before, summing to at most INT32_MAX (the kernels' offsets are ints)
int64_t rows_of(const at::Tensor& sizes, int64_t capacity) {
  if (sizes.device().type() != c10::kCPU || sizes.scalar_type() != c10::ScalarType::Long ||
      sizes.dim() != 1 || !sizes.is_contiguous())
    return -1;
  const int64_t T = sizes.size(0);
  if (T < 1 || T > capacity) return -1;
  const int64_t* s = sizes.data_ptr<int64_t>();
  int64_t rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (s[t] < 1 || (t && s[t] > s[t - 1])) return -1;
    rows += s[t];
  }
  return rows > INT32_MAX ? -1 : rows;
}

// cf_unpack_rows's or cf_pack_rows's arguments (codegen/packed_rows.py's args_fields) for batch sizes
// that rows_of took: `head` with T and B written, then the sizes and their offsets, `capacity` ints each
void rows_args(const at::Tensor& sizes, int64_t capacity, RowsHead head, std::vector<uint8_t>& out) {
  const int64_t T = sizes.size(0);
  if (T > capacity) throw std::length_error("more batch sizes than the arguments hold");  // (rows_of's)
  const int64_t* s = sizes.data_ptr<int64_t>();
  out.assign(sizeof(RowsHead) + 2 * capacity * sizeof(int32_t), 0);
  int32_t* sized = reinterpret_cast<int32_t*>(out.data() + sizeof(RowsHead));
  int32_t* offsets = sized + capacity;
  int64_t rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    sized[t] = (int32_t)s[t];
    offsets[t] = (int32_t)rows;
    rows += s[t];
  }
  head.T = (int32_t)T;
  head.B = (int32_t)s[0];
  std::memcpy(out.data(), &head, sizeof(head));
}

// cf_unpack_rows's arguments for a PackedSequence's data and batch sizes into x and steps, or false
// where the sizes are not those of a call this lane makes
bool unpack_args(const Core& c, const at::Tensor& data, const at::Tensor& sizes, const at::Tensor& x,
                 const at::Tensor& steps, std::vector<uint8_t>& out) {
  if (rows_of(sizes, c.capacity) != data.size(0) || sizes.data_ptr<int64_t>()[0] != c.x_sizes[1] ||
      (sizes.size(0) + STEPS_MULTIPLE - 1) / STEPS_MULTIPLE * STEPS_MULTIPLE != c.x_sizes[0])
    return false;
  RowsHead head{reinterpret_cast<uint64_t>(data.data_ptr()), reinterpret_cast<uint64_t>(x.data_ptr()),
                reinterpret_cast<uint64_t>(steps.data_ptr()), x.numel(), steps.numel(), 0, 0,
                (int32_t)c.x_sizes[2], (int32_t)c.H};
  rows_args(sizes, c.capacity, head, out);
  return true;
}

// (y, [final states]) of a PackedSequence's call made here (its data padded, then the run replayed), or
// None where it is not one this lane makes
PyObject* packed_call(Core& c, PyObject* data_obj, PyObject* sizes_obj, PyObject* params, uint64_t stream) {
  if (c.unpack == nullptr || c.dtype != c10::ScalarType::Float || c.out_dtype != c.dtype ||
      !is_tensor(data_obj) ||
      !is_tensor(sizes_obj))
    Py_RETURN_NONE;
  const at::Tensor& data = THPVariable_Unpack(data_obj);
  const at::Tensor& sizes = THPVariable_Unpack(sizes_obj);
  if (data.scalar_type() != c.dtype || data.device() != c.device || data.dim() != 2 ||
      data.size(1) != c.x_sizes[2] || !data.is_contiguous())
    Py_RETURN_NONE;
  if (!may_call(c, params, stream)) Py_RETURN_NONE;
  at::Tensor x = empty(c.x_sizes, c.dtype, c.device);
  at::Tensor steps = empty(c.state_sizes, c10::ScalarType::Float, c.device);
  std::vector<uint8_t> args;
  if (!unpack_args(c, data, sizes, x, steps, args)) Py_RETURN_NONE;
  std::vector<uint64_t> state_at;  // the module's zeros, then the steps-left state
  for (size_t i = 0; i + 1 < c.zeros.size(); ++i)
    state_at.push_back(reinterpret_cast<uint64_t>(c.zeros[i].data_ptr()));
  state_at.push_back(reinterpret_cast<uint64_t>(steps.data_ptr()));
  return replay(c, x, state_at, &args);
}

// the run replayed over x and the states (after cf_unpack_rows with these arguments, where given)
PyObject* replay(Core& c, const at::Tensor& x, const std::vector<uint64_t>& state_at,
                 const std::vector<uint8_t>* unpack_args) {
  Turn turn(c);
  if (!turn.ok() || !current(c)) Py_RETURN_NONE;
  int64_t n = c.block_elements;
  at::Tensor block = empty(c10::IntArrayRef(&n, 1), c.out_dtype, c.device);
  uint64_t base = reinterpret_cast<uint64_t>(block.data_ptr()), size = block.element_size();
  // the runner's bases: scratch, the packed weights, x, y's sequence, no gradients, the initial states,
  // the final states (CudaRunner's RESERVE, PACKED, X, OUT, GRADS, STATES)
  std::vector<uint64_t> bases{base + c.outputs_end * size, c.packed, reinterpret_cast<uint64_t>(x.data_ptr()),
                              base, 0};
  bases.insert(bases.end(), state_at.begin(), state_at.end());
  for (int64_t at : c.finals_at) bases.push_back(base + at * size);
  const Kept* kept = find(c, bases);
  if (kept == nullptr) {  // (Python's call captures or finds it, and teaches it)
    c.missed = std::move(bases);
    Py_RETURN_NONE;
  }
  // (the conversion's memory, where the types differ, taken before the replay: out of memory then leaves
  // the call to Python's path, which raises it, before anything ran)
  at::Tensor given = block;  // (where the types differ: the outputs' copy in x's type)
  if (c.out_dtype != c.dtype)
    given = empty(c10::IntArrayRef(&c.outputs_end, 1), c.dtype, c.device);
  if (unpack_args != nullptr) {
    void* arg = const_cast<uint8_t*>(unpack_args->data());
    if (c.launch_kernel(c.unpack, (unsigned)c.grid, 1, 1, BLOCK, 1, 1, 0, reinterpret_cast<void*>(c.stream),
                        &arg, nullptr) != 0)
      Py_RETURN_NONE;  // (Python's call tries again and says why)
  }
  if (c.launch(reinterpret_cast<void*>(kept->graph), reinterpret_cast<void*>(c.stream)) != 0)
    Py_RETURN_NONE;  // (as above; a padding done again writes the same)
  count_replay(c);
  // the outputs' views made after the launch, which the GPU starts on meanwhile (a B=1 call's time is its
  // host time to the launch plus the run's): views of memory already held do not fail
  if (c.out_dtype != c.dtype) given.copy_(block.narrow(0, 0, c.outputs_end));  // (on the run's stream)
  int64_t row = c.B * c.H;
  at::Tensor y = given.as_strided({c.T, c.B, c.H}, {row, c.H, 1}, row);
  if (c.batch_first) y = y.transpose(0, 1);
  std::vector<at::Tensor> finals;
  for (int64_t at : c.finals_at) finals.push_back(given.as_strided({c.L, c.B, c.H}, {row, c.H, 1}, at));
  PyObject* out = PyTuple_New(2);
  PyObject* final_states = PyList_New((Py_ssize_t)finals.size());
  if (out == nullptr || final_states == nullptr) {
    Py_XDECREF(out);
    Py_XDECREF(final_states);
    return nullptr;
  }
  PyTuple_SET_ITEM(out, 1, final_states);
  for (size_t i = 0; i < finals.size(); ++i) {
    PyObject* f = THPVariable_Wrap(std::move(finals[i]));
    if (f == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(final_states, i, f);
  }
  PyObject* wrapped = THPVariable_Wrap(std::move(y));
  if (wrapped == nullptr) {
    Py_DECREF(out);
    return nullptr;
  }
  PyTuple_SET_ITEM(out, 0, wrapped);
  return out;
}

PyObject* lane_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n != 4 || kwnames != nullptr) {
    PyErr_SetString(PyExc_TypeError, "a lane is called as lane(x, params, states or None, stream)");
    return nullptr;
  }
  uint64_t stream;
  if (!stream_arg(args[3], stream)) return nullptr;
  return none_where_it_throws(
      [&] { return call(reinterpret_cast<Lane*>(self), args[0], args[1], args[2], stream); });
}

uint64_t as_u64(PyObject* o) { return PyLong_AsUnsignedLongLong(o); }

std::vector<int64_t> int_list(PyObject* seq) {
  std::vector<int64_t> out;
  PyObject* fast = PySequence_Fast(seq, "a sequence of ints");
  if (fast == nullptr) throw std::invalid_argument("a sequence of ints");
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
    out.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i)));
  Py_DECREF(fast);
  return out;
}

const char* kwlist[] = {"x", "params", "zeros", "batch_first", "sizes", "block_elements", "outputs_end",
                        "finals_at", "packed", "stream", "context", "changes", "locks", "program",
                        "entry_points", "rows", nullptr};

PyObject* lane_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  PyObject *x, *params, *zeros, *sizes, *finals_at, *packed, *stream, *context, *changes, *program;
  PyObject *lock_a, *lock_b, *launch, *capturing, *current_context, *launch_kernel, *rows = Py_None;
  int batch_first;
  long long block_elements, outputs_end;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O!pOLLOOOOO(OO)O(OOOO)|O:Lane", const_cast<char**>(kwlist),
                                   THPVariableClass, &x, &PyList_Type, &params, &PyList_Type, &zeros,
                                   &batch_first, &sizes, &block_elements, &outputs_end, &finals_at, &packed,
                                   &stream, &context, &changes, &lock_a, &lock_b, &program, &launch,
                                   &capturing, &current_context, &launch_kernel, &rows))
    return nullptr;
  auto core = std::make_unique<Core>();
  Core& c = *core;
  try {
    const at::Tensor& xt = THPVariable_Unpack(x);
    c.x_sizes = xt.sizes().vec();
    c.dtype = xt.scalar_type();
    c.device = xt.device();
    c.batch_first = batch_first;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(params); ++i) {
      PyObject* o = PyList_GET_ITEM(params, i);
      if (!is_tensor(o)) throw std::invalid_argument("params: tensors");
      const at::Tensor& p = THPVariable_Unpack(o);
      c10::TensorImpl* impl = p.unsafeGetTensorImpl();
      if (impl->is_inference()) throw std::invalid_argument("params: not inference tensors");
      c.params.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(p.getIntrusivePtr()), impl->data(),
                          p.scalar_type(), impl->version_counter().current_version()});
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(zeros); ++i) {
      PyObject* o = PyList_GET_ITEM(zeros, i);
      if (!is_tensor(o)) throw std::invalid_argument("zeros: tensors");
      c.zeros.push_back(THPVariable_Unpack(o));
    }
    if (c.zeros.empty()) throw std::invalid_argument("zeros: one per state");
    c.state_sizes = c.zeros[0].sizes().vec();
    c.out_dtype = c.zeros[0].scalar_type();
    std::vector<int64_t> s = int_list(sizes);
    if (s.size() != 4) throw std::invalid_argument("sizes: (T, B, H, L)");
    c.T = s[0], c.B = s[1], c.H = s[2], c.L = s[3];
    c.block_elements = block_elements;
    c.outputs_end = outputs_end;
    c.finals_at = int_list(finals_at);
    if (c.finals_at.size() != c.zeros.size()) throw std::invalid_argument("finals_at: one per state");
    if (rows != Py_None) {  // (cf_unpack_rows's function, the steps its arguments hold, its blocks)
      std::vector<int64_t> r = int_list(rows);
      if (r.size() != 3 || r[0] == 0 || r[1] < 1 || r[2] < 1 || c.x_sizes.size() != 3)
        throw std::invalid_argument("rows: (function, capacity, grid)");
      c.unpack = reinterpret_cast<void*>(r[0]);
      c.capacity = r[1], c.grid = r[2];
    }
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_ValueError, "a lane cannot be made of these arguments: %s", e.what());
    return nullptr;
  }
  c.packed = as_u64(packed);
  c.stream = as_u64(stream);
  c.context = as_u64(context);
  c.launch = reinterpret_cast<GraphLaunch>(as_u64(launch));
  c.capturing = reinterpret_cast<StreamIsCapturing>(as_u64(capturing));
  c.current_context = reinterpret_cast<CtxGetCurrent>(as_u64(current_context));
  c.launch_kernel = reinterpret_cast<LaunchKernel>(as_u64(launch_kernel));
  if (PyErr_Occurred()) return nullptr;
  if (!c.launch || !c.capturing || !c.current_context || !c.launch_kernel) {
    PyErr_SetString(PyExc_ValueError, "a lane needs the driver's four entry points");
    return nullptr;
  }
  PyObject* seen = PyObject_GetAttr(changes, value_name);
  if (seen == nullptr) return nullptr;
  c.changes_seen = PyLong_AsLongLong(seen);
  Py_DECREF(seen);
  if (PyErr_Occurred()) return nullptr;
  Py_INCREF(changes);
  Py_INCREF(lock_a);
  Py_INCREF(lock_b);
  Py_INCREF(program);
  c.changes = changes;
  c.locks[0] = lock_a;
  c.locks[1] = lock_b;
  c.program = program;
  Lane* self = reinterpret_cast<Lane*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;  // (the references taken go with the core, freed here)
  self->vectorcall = lane_vectorcall;
  self->core = core.release();
  return reinterpret_cast<PyObject*>(self);
}

void lane_dealloc(PyObject* o) {
  PyTypeObject* type = Py_TYPE(o);
  delete reinterpret_cast<Lane*>(o)->core;
  type->tp_free(o);
  Py_DECREF(type);  // (an instance of a heap type holds a reference to it)
}

PyObject* lane_learn(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  // learn(bases, graph): the captured run over these bases (a sequence of ints), a CUgraphExec's address
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "learn(bases, graph)");
    return nullptr;
  }
  Core& c = *reinterpret_cast<Lane*>(o)->core;
  std::vector<uint64_t> bases;
  PyObject* fast = PySequence_Fast(args[0], "bases: a sequence of ints");
  if (fast == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
    bases.push_back(PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i)));
  Py_DECREF(fast);
  uint64_t graph = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) return nullptr;
  for (auto it = c.kept.begin(); it != c.kept.end(); ++it)
    if (it->bases == bases) {
      c.kept.erase(it);
      break;
    }
  if (c.kept.size() >= MAX_KEPT) c.kept.erase(c.kept.begin());
  c.kept.push_back({std::move(bases), graph});
  Py_RETURN_NONE;
}

PyObject* lane_packed(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError, "packed(data, batch_sizes, params, stream)");
    return nullptr;
  }
  uint64_t stream;
  if (!stream_arg(args[3], stream)) return nullptr;
  return none_where_it_throws(
      [&] { return packed_call(*reinterpret_cast<Lane*>(o)->core, args[0], args[1], args[2], stream); });
}

PyObject* lane_current(PyObject* o, PyObject*) {
  return PyBool_FromLong(current(*reinterpret_cast<Lane*>(o)->core));
}

PyObject* lane_known(PyObject* o, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<Lane*>(o)->core->kept.size());
}

PyObject* lane_missed(PyObject* o, PyObject*) {
  const std::vector<uint64_t>& bases = reinterpret_cast<Lane*>(o)->core->missed;
  PyObject* out = PyTuple_New((Py_ssize_t)bases.size());
  for (size_t i = 0; out != nullptr && i < bases.size(); ++i)
    PyTuple_SET_ITEM(out, i, PyLong_FromUnsignedLongLong(bases[i]));
  return out;
}

PyMethodDef lane_methods[] = {
    {"learn", (PyCFunction)(void (*)(void))lane_learn, METH_FASTCALL,
     "learn(bases, graph): a captured run of the program over these bases, replayed from then on"},
    {"packed", (PyCFunction)(void (*)(void))lane_packed, METH_FASTCALL,
     "packed(data, batch_sizes, params, stream): (y, [final states]) of a PackedSequence's call with no "
     "initial states, its data padded here, or None"},
    {"current", lane_current, METH_NOARGS, "whether nothing it depends on changed since it was made"},
    {"known", lane_known, METH_NOARGS, "how many captured runs it knows"},
    {"missed", lane_missed, METH_NOARGS,
     "the bases of the last call it left to Python for want of a captured run over them (() if none)"},
    {nullptr, nullptr, 0, nullptr}};

PyMemberDef lane_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Lane, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot lane_slots[] = {{Py_tp_new, (void*)lane_new},
                            {Py_tp_dealloc, (void*)lane_dealloc},
                            {Py_tp_call, (void*)PyVectorcall_Call},
                            {Py_tp_methods, lane_methods},
                            {Py_tp_members, lane_members},
                            {Py_tp_doc, (void*)"A module's kept inference call, made in C++ (see the source)."},
                            {0, nullptr}};

PyType_Spec lane_spec = {"cf_quick_lane.Lane", sizeof(Lane), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL, lane_slots};

// -- a PackedSequence's rows ------------------------------------------------------------------------
// `Rows`: codegen/packed_rows.py's kernels for elements of one size on one device, launched here with
// the call's memory taken from torch's caching allocator, for the padding and packing of the calls that
// the lane does not make (training calls, calls given initial states): the same launches as
// nn/packed_sequences.py's _Rows makes in Python, where its arguments' bytes, allocations and launch
// took a training step's host 30 to 160 us each time, several times a step. It answers None for what it
// cannot move as that Python would (the batch sizes not a PackedSequence's, another device or context
// current, the launch failed), which Python then moves, or raises about. Its `zeroed` zeroes the padding
// of rows of lengths of their own (CellRNN's `lengths=`) and writes their steps-left state in one launch
// of cf_zero_rows, where torch's ops (nn/stacks.py) took 0.2 to 0.4 ms of a call's host time; its
// `reversed` reverses such rows in time for a bidirectional layer's reverse direction in one launch of
// cf_reverse_rows, where a gather by an index made on the host took 0.15 ms; where either answers None,
// torch's ops do it.

struct RowsCore {
  void* unpack = nullptr;  // cf_unpack_rows
  void* pack = nullptr;    // cf_pack_rows
  void* zero = nullptr;    // cf_zero_rows
  void* reverse = nullptr; // cf_reverse_rows
  int64_t itemsize = 0, capacity = 0, max_grid = 0;
  c10::Device device{c10::kCPU};
  uint64_t context = 0;
  CtxGetCurrent current_context = nullptr;
  LaunchKernel launch_kernel = nullptr;
};

struct Rows {
  PyObject_HEAD
  RowsCore* core;
};

// whether the kernels may be launched now: the device current, and its driver context
bool rows_ready(const RowsCore& r) { return device_current(r.device, r.context, r.current_context); }

// one launch over `rows` rows (a warp a row, as codegen/packed_rows.py's launch_blocks): false where it
// failed
bool launch_rows(const RowsCore& r, void* function, int64_t rows, std::vector<uint8_t>& args, uint64_t stream) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((rows * 32 + BLOCK - 1) / BLOCK, r.max_grid));
  void* arg = args.data();
  return r.launch_kernel(function, (unsigned)blocks, 1, 1, BLOCK, 1, 1, 0, reinterpret_cast<void*>(stream),
                         &arg, nullptr) == 0;
}

// (x, the steps-left state or None where it was not made) as Python objects
PyObject* padded_pair(at::Tensor x, at::Tensor steps_left) {
  PyObject* padded = THPVariable_Wrap(std::move(x));
  if (padded == nullptr) return nullptr;
  PyObject* left = steps_left.defined() ? THPVariable_Wrap(std::move(steps_left)) : Py_NewRef(Py_None);
  if (left == nullptr) {
    Py_DECREF(padded);
    return nullptr;
  }
  return Py_BuildValue("(NN)", padded, left);  // (both references given to the tuple)
}

// (x [steps, B, ...] from the data [N, ...], the steps-left state [state_layers, B, hidden] or None), or
// None (see above)
PyObject* rows_padded(const RowsCore& r, PyObject* data_obj, PyObject* sizes_obj, int64_t steps, int64_t hidden,
                      int64_t state_layers, uint64_t stream) {
  if (!is_tensor(data_obj) || !is_tensor(sizes_obj) || hidden < 1 || state_layers < 0) Py_RETURN_NONE;
  at::Tensor data = THPVariable_Unpack(data_obj);
  const at::Tensor& sizes = THPVariable_Unpack(sizes_obj);
  if (data.device() != r.device || data.element_size() != r.itemsize || data.dim() < 1 || !rows_ready(r))
    Py_RETURN_NONE;
  const int64_t rows = rows_of(sizes, r.capacity);
  if (rows != data.size(0) || steps < sizes.size(0)) Py_RETURN_NONE;
  if (!data.is_contiguous()) data = data.contiguous();
  const int64_t B = sizes.data_ptr<int64_t>()[0], W = data.numel() / rows;
  std::vector<int64_t> shape{steps, B};
  shape.insert(shape.end(), data.sizes().begin() + 1, data.sizes().end());
  at::Tensor x = empty(shape, data.scalar_type(), r.device);
  at::Tensor left;
  if (state_layers) left = empty({state_layers, B, hidden}, c10::ScalarType::Float, r.device);
  RowsHead head{reinterpret_cast<uint64_t>(data.data_ptr()), reinterpret_cast<uint64_t>(x.data_ptr()),
                state_layers ? reinterpret_cast<uint64_t>(left.data_ptr()) : 0, x.numel(),
                state_layers ? left.numel() : 0, 0, 0, (int32_t)W, (int32_t)hidden};
  std::vector<uint8_t> args;
  rows_args(sizes, r.capacity, head, args);
  if (!launch_rows(r, r.unpack, steps * B + (state_layers ? state_layers * B : 0), args, stream))
    Py_RETURN_NONE;
  return padded_pair(std::move(x), std::move(left));
}

// the packed data [N, ...] of y [T' >= T, B, ...], or None (see above)
PyObject* rows_packed(const RowsCore& r, PyObject* y_obj, PyObject* sizes_obj, uint64_t stream) {
  if (!is_tensor(y_obj) || !is_tensor(sizes_obj)) Py_RETURN_NONE;
  at::Tensor y = THPVariable_Unpack(y_obj);
  const at::Tensor& sizes = THPVariable_Unpack(sizes_obj);
  if (y.device() != r.device || y.element_size() != r.itemsize || y.dim() < 2 || !rows_ready(r))
    Py_RETURN_NONE;
  const int64_t rows = rows_of(sizes, r.capacity);
  if (rows < 0 || y.size(0) < sizes.size(0) || y.size(1) != sizes.data_ptr<int64_t>()[0]) Py_RETURN_NONE;
  if (!y.is_contiguous()) y = y.contiguous();
  const int64_t W = y.numel() / (y.size(0) * y.size(1));
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), y.sizes().begin() + 2, y.sizes().end());
  at::Tensor data = empty(shape, y.scalar_type(), r.device);
  RowsHead head{reinterpret_cast<uint64_t>(y.data_ptr()), reinterpret_cast<uint64_t>(data.data_ptr()), 0,
                data.numel(), 0, 0, 0, (int32_t)W, 0};
  std::vector<uint8_t> args;
  rows_args(sizes, r.capacity, head, args);
  if (!launch_rows(r, r.pack, rows, args, stream)) Py_RETURN_NONE;
  return THPVariable_Wrap(std::move(data));
}

// whether x [T, B, W] (the strides of its first two dimensions any, its rows contiguous) and the rows'
// lengths (on the CPU, int64, B of them, at most `capacity`, each from 1 to T) are such as the kernels of
// rows of lengths of their own take, with the lengths written after the head of `args`, their
// arguments, and `*full` (where given) whether every row is T long
bool lengths_args(const RowsCore& r, const at::Tensor& x, const at::Tensor& lengths, std::vector<uint8_t>& args,
                  bool* full = nullptr) {
  if (x.device() != r.device || x.element_size() != r.itemsize || x.dim() != 3 || x.numel() == 0 ||
      (x.stride(2) != 1 && x.size(2) != 1) || !rows_ready(r))
    return false;
  const int64_t T = x.size(0), B = x.size(1), W = x.size(2);
  if (lengths.device().type() != c10::kCPU || lengths.scalar_type() != c10::ScalarType::Long ||
      lengths.dim() != 1 || lengths.size(0) != B || B > r.capacity || !lengths.is_contiguous() ||
      T > INT32_MAX || W * r.itemsize > INT32_MAX)  // (the kernels' ints)
    return false;
  args.assign(sizeof(LengthsHead) + r.capacity * sizeof(int32_t), 0);
  int32_t* each = reinterpret_cast<int32_t*>(args.data() + sizeof(LengthsHead));
  const int64_t* given = lengths.data_ptr<int64_t>();
  bool every_full = true;
  for (int64_t b = 0; b < B; ++b) {
    if (given[b] < 1 || given[b] > T) return false;
    each[b] = (int32_t)given[b];
    every_full = every_full && given[b] == T;
  }
  if (full) *full = every_full;
  return true;
}

// (x [T, B, W] with each row's steps past its length zero, the steps-left state [state_layers, B, hidden]
// float32 or None) from x and the rows' lengths (as lengths_args takes them), or None (see above, and
// where the lengths are not such: Python's check then says why). Where every row is T long, x itself
// (nothing to zero: the launch writes the steps-left state alone, if any).
PyObject* rows_zeroed(const RowsCore& r, PyObject* x_obj, PyObject* lengths_obj, int64_t hidden,
                      int64_t state_layers, uint64_t stream) {
  if (!is_tensor(x_obj) || !is_tensor(lengths_obj) || hidden < 1 || hidden > INT32_MAX || state_layers < 0)
    Py_RETURN_NONE;
  const at::Tensor& x = THPVariable_Unpack(x_obj);
  std::vector<uint8_t> args;
  bool full;  // (every row T long: x has no padding, and is given back as it is, as torch's ops do)
  if (!lengths_args(r, x, THPVariable_Unpack(lengths_obj), args, &full)) Py_RETURN_NONE;
  const int64_t T = x.size(0), B = x.size(1), W = x.size(2);
  at::Tensor zeroed = full ? x : empty({T, B, W}, x.scalar_type(), r.device);
  at::Tensor left;
  if (state_layers) left = empty({state_layers, B, hidden}, c10::ScalarType::Float, r.device);
  const int64_t rows = full ? 0 : T;  // (the kernel's steps of x to copy)
  LengthsHead head{full ? 0 : reinterpret_cast<uint64_t>(x.data_ptr()),
                   full ? 0 : reinterpret_cast<uint64_t>(zeroed.data_ptr()),
                   state_layers ? reinterpret_cast<uint64_t>(left.data_ptr()) : 0, x.stride(0), x.stride(1),
                   state_layers ? left.numel() : 0, (int32_t)rows, (int32_t)B, (int32_t)W, (int32_t)hidden};
  std::memcpy(args.data(), &head, sizeof(head));
  if (rows * B + state_layers * B && !launch_rows(r, r.zero, rows * B + state_layers * B, args, stream))
    Py_RETURN_NONE;
  return padded_pair(std::move(zeroed), std::move(left));
}

// x [T, B, W] with each row's first `lengths` steps in reverse order (the steps after in place), a new
// contiguous tensor, from x and the lengths as lengths_args takes them, or None (see above)
PyObject* rows_reversed(const RowsCore& r, PyObject* x_obj, PyObject* lengths_obj, uint64_t stream) {
  if (!is_tensor(x_obj) || !is_tensor(lengths_obj)) Py_RETURN_NONE;
  const at::Tensor& x = THPVariable_Unpack(x_obj);
  std::vector<uint8_t> args;
  if (!lengths_args(r, x, THPVariable_Unpack(lengths_obj), args)) Py_RETURN_NONE;
  const int64_t T = x.size(0), B = x.size(1), W = x.size(2);
  at::Tensor reversed = empty({T, B, W}, x.scalar_type(), r.device);
  LengthsHead head{reinterpret_cast<uint64_t>(x.data_ptr()), reinterpret_cast<uint64_t>(reversed.data_ptr()),
                   0, x.stride(0), x.stride(1), 0, (int32_t)T, (int32_t)B, (int32_t)W, 0};
  std::memcpy(args.data(), &head, sizeof(head));
  if (!launch_rows(r, r.reverse, T * B, args, stream)) Py_RETURN_NONE;
  return THPVariable_Wrap(std::move(reversed));
}

bool int_arg(PyObject* o, int64_t& out) {
  out = PyLong_AsLongLong(o);
  return !(out == -1 && PyErr_Occurred());
}

PyObject* rows_padded_method(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  if (n != 6) {
    PyErr_SetString(PyExc_TypeError, "padded(data, batch_sizes, steps, hidden, state_layers, stream)");
    return nullptr;
  }
  int64_t steps, hidden, state_layers;
  if (!int_arg(args[2], steps) || !int_arg(args[3], hidden) || !int_arg(args[4], state_layers)) return nullptr;
  uint64_t stream;
  if (!stream_arg(args[5], stream)) return nullptr;
  return none_where_it_throws([&] {
    return rows_padded(*reinterpret_cast<Rows*>(o)->core, args[0], args[1], steps, hidden, state_layers, stream);
  });
}

PyObject* rows_packed_method(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  if (n != 3) {
    PyErr_SetString(PyExc_TypeError, "packed(y, batch_sizes, stream)");
    return nullptr;
  }
  uint64_t stream;
  if (!stream_arg(args[2], stream)) return nullptr;
  return none_where_it_throws(
      [&] { return rows_packed(*reinterpret_cast<Rows*>(o)->core, args[0], args[1], stream); });
}

PyObject* rows_zeroed_method(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  if (n != 5) {
    PyErr_SetString(PyExc_TypeError, "zeroed(x, lengths, hidden, state_layers, stream)");
    return nullptr;
  }
  int64_t hidden, state_layers;
  if (!int_arg(args[2], hidden) || !int_arg(args[3], state_layers)) return nullptr;
  uint64_t stream;
  if (!stream_arg(args[4], stream)) return nullptr;
  return none_where_it_throws([&] {
    return rows_zeroed(*reinterpret_cast<Rows*>(o)->core, args[0], args[1], hidden, state_layers, stream);
  });
}

PyObject* rows_reversed_method(PyObject* o, PyObject* const* args, Py_ssize_t n) {
  if (n != 3) {
    PyErr_SetString(PyExc_TypeError, "reversed(x, lengths, stream)");
    return nullptr;
  }
  uint64_t stream;
  if (!stream_arg(args[2], stream)) return nullptr;
  return none_where_it_throws(
      [&] { return rows_reversed(*reinterpret_cast<Rows*>(o)->core, args[0], args[1], stream); });
}

const char* rows_kwlist[] = {"device", "itemsize", "unpack", "pack", "zero", "reverse", "capacity",
                             "max_grid", "context", "entry_points", nullptr};

PyObject* rows_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  long long device, itemsize, capacity, max_grid;
  PyObject *unpack, *pack, *zero, *reverse, *context, *current_context, *launch_kernel;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "LLOOOOLLO(OO):Rows", const_cast<char**>(rows_kwlist), &device,
                                   &itemsize, &unpack, &pack, &zero, &reverse, &capacity, &max_grid, &context,
                                   &current_context, &launch_kernel))
    return nullptr;
  auto core = std::make_unique<RowsCore>();
  RowsCore& r = *core;
  r.device = device < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, (c10::DeviceIndex)device);
  r.itemsize = itemsize, r.capacity = capacity, r.max_grid = max_grid;
  r.unpack = reinterpret_cast<void*>(as_u64(unpack));
  r.pack = reinterpret_cast<void*>(as_u64(pack));
  r.zero = reinterpret_cast<void*>(as_u64(zero));
  r.reverse = reinterpret_cast<void*>(as_u64(reverse));
  r.context = as_u64(context);
  r.current_context = reinterpret_cast<CtxGetCurrent>(as_u64(current_context));
  r.launch_kernel = reinterpret_cast<LaunchKernel>(as_u64(launch_kernel));
  if (PyErr_Occurred()) return nullptr;
  if (!r.unpack || !r.pack || !r.zero || !r.reverse || !r.current_context || !r.launch_kernel || capacity < 1 ||
      max_grid < 1 || (itemsize != 2 && itemsize != 4)) {
    PyErr_SetString(PyExc_ValueError, "Rows needs the four kernels, the driver's two entry points, a "
                                      "capacity, a largest grid and elements of 2 or 4 bytes");
    return nullptr;
  }
  Rows* self = reinterpret_cast<Rows*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->core = core.release();
  return reinterpret_cast<PyObject*>(self);
}

void rows_dealloc(PyObject* o) {
  PyTypeObject* type = Py_TYPE(o);
  delete reinterpret_cast<Rows*>(o)->core;
  type->tp_free(o);
  Py_DECREF(type);
}

PyMethodDef rows_methods[] = {
    {"padded", (PyCFunction)(void (*)(void))rows_padded_method, METH_FASTCALL,
     "padded(data, batch_sizes, steps, hidden, state_layers, stream): (x, the steps-left state or None), "
     "or None"},
    {"packed", (PyCFunction)(void (*)(void))rows_packed_method, METH_FASTCALL,
     "packed(y, batch_sizes, stream): the packed data of y, or None"},
    {"zeroed", (PyCFunction)(void (*)(void))rows_zeroed_method, METH_FASTCALL,
     "zeroed(x, lengths, hidden, state_layers, stream): (x with each row's padding zero, the steps-left "
     "state or None), or None"},
    {"reversed", (PyCFunction)(void (*)(void))rows_reversed_method, METH_FASTCALL,
     "reversed(x, lengths, stream): x with each row's first lengths steps in reverse order, or None"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot rows_slots[] = {{Py_tp_new, (void*)rows_new},
                            {Py_tp_dealloc, (void*)rows_dealloc},
                            {Py_tp_methods, rows_methods},
                            {Py_tp_doc, (void*)"A PackedSequence's rows padded and packed in C++ (see the source)."},
                            {0, nullptr}};

PyType_Spec rows_spec = {"cf_quick_lane.Rows", sizeof(Rows), 0, Py_TPFLAGS_DEFAULT, rows_slots};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "cf_quick_lane", nullptr, -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_cf_quick_lane(void) {
  value_name = PyUnicode_InternFromString("value");
  acquire_name = PyUnicode_InternFromString("acquire");
  release_name = PyUnicode_InternFromString("release");
  replays_name = PyUnicode_InternFromString("_replays");
  one = PyLong_FromLong(1);
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  PyObject* lane = PyType_FromSpec(&lane_spec);
  if (lane == nullptr || PyModule_AddObject(m, "Lane", lane) != 0) {
    Py_XDECREF(lane);
    Py_DECREF(m);
    return nullptr;
  }
  PyObject* rows = PyType_FromSpec(&rows_spec);
  if (rows == nullptr || PyModule_AddObject(m, "Rows", rows) != 0) {
    Py_XDECREF(rows);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
