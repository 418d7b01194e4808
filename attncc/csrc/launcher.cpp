// attncc/csrc/launcher.cpp: the compiled host side of an eager CUDA call (DESIGN.md §3a).
//
// One Launcher belongs to one spec's op (attncc/ops.py) and one built kernel library. Its call
// takes a Kernel call's arguments as the user passed them and enqueues the launch without
// running Python. It reads each argument's metadata (dtype, device, sizes, strides, 16-byte
// alignment) into a signature, and keeps, for each signature, what ops.prepare made of it:
// the AttnccArgs of abi.h without pointers, scale and stream, and the shapes of the outputs
// and the workspace. A signature not seen before goes to Python (`prepare`), which validates
// the call (raising validate.py's named error) and prepares it, or answers None for a call the
// Python path takes (one that needs copies). So every rule lives once, in Python: this file
// remembers the answers and fills in the pointers. A WriteLauncher does the same for
// k.write_cache (the library's attncc_write_cache, ops.prepare_write). Built once per attncc,
// torch and Python by attncc/launcher.py; holds the GIL throughout.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attncc/abi.h"

namespace py = pybind11;

namespace {

using LaunchFn = int (*)(const AttnccArgs*);
using Signature = std::vector<int64_t>;

constexpr size_t kMaxSignatures = 4096;  // then forget them all (an engine uses a handful)
constexpr int64_t kNone = -1;            // an argument that is None

struct SignatureHash {
  size_t operator()(const Signature& s) const noexcept {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the words
    for (int64_t v : s) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
    return static_cast<size_t>(h);
  }
};

// What ops.prepare made of one signature.
struct Entry {
  bool fast = false;  // false: the Python path takes these calls
  AttnccArgs args{};  // everything but the pointers, the scale and the stream
  std::vector<int64_t> out_shape, lse_shape;
  int64_t workspace_floats = 0;    // partial_out and partial_lse (abi.h), 0 when none
  int64_t partial_lse_offset = 0;  // floats from partial_out to partial_lse
};

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> shape_of(py::handle shape) { return shape.cast<std::vector<int64_t>>(); }

template <class T, size_t N>
void fill(T (&field)[N], py::handle values) {
  const auto v = values.cast<std::vector<int64_t>>();
  for (size_t i = 0; i < v.size() && i < N; ++i) field[i] = static_cast<T>(v[i]);
}

// The cache's fields of AttnccArgs or AttnccWriteArgs from a preparation's (ops.Prepared,
// ops.PreparedWrite): its page count and each tensor's strides.
template <class Args>
void fill_cache(Args& a, py::handle p) {
  a.num_pages = p.attr("num_pages").cast<int>();
  fill(a.page_stride, p.attr("page_stride"));
  fill(a.token_stride, p.attr("token_stride"));
  fill(a.head_stride, p.attr("head_stride"));
}

// An argument's words of the signature; false when it is neither None nor a tensor with storage.
bool sign(Signature& sig, py::handle h, at::Tensor* t) {
  if (h.is_none()) {
    sig.push_back(kNone);
    return true;
  }
  if (!THPVariable_Check(h.ptr())) return false;
  *t = THPVariable_Unpack(h.ptr());
  if (!t->has_storage()) return false;
  sig.push_back(static_cast<int64_t>(t->scalar_type()));
  sig.push_back(static_cast<int64_t>(t->device().type()) * 65536 + t->device().index());
  sig.push_back(t->dim());
  for (int64_t s : t->sizes()) sig.push_back(s);
  for (int64_t s : t->strides()) sig.push_back(s);
  sig.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t->data_ptr()) & 15));
  sig.push_back((t->storage_offset() * static_cast<int64_t>(t->element_size())) & 15);
  return true;
}

// A dict with exactly the given names, each a tensor (in the names' order): the words of each.
bool sign_dict(Signature& sig, py::handle dict, const std::vector<std::string>& names, at::Tensor* tensors) {
  if (!PyDict_Check(dict.ptr()) || PyDict_Size(dict.ptr()) != static_cast<Py_ssize_t>(names.size())) return false;
  for (size_t i = 0; i < names.size(); ++i) {
    PyObject* item = PyDict_GetItemString(dict.ptr(), names[i].c_str());  // borrowed
    if (item == nullptr || !sign(sig, py::handle(item), tensors + i) || !tensors[i].defined()) return false;
  }
  return true;
}

// A packed cache is one tensor, a separate one a dict with exactly the plan's names.
bool sign_cache(Signature& sig, py::handle cache, const std::vector<std::string>& names, bool separate, at::Tensor* tensors) {
  sig.push_back(separate ? 1 : 0);
  if (!separate) return !cache.is_none() && sign(sig, cache, tensors);
  return sign_dict(sig, cache, names, tensors);
}

// Whether a tensor is on a CUDA device other than the current one (the Python path switches).
bool elsewhere(const at::Tensor& t) {
  const c10::Device device = t.device();
  return device.is_cuda() && c10::impl::getDeviceGuardImpl(device.type())->getDevice() != device;
}

// The cache's tensors of a separate spec: plan order; at most ATTNCC_MAX_TENSORS, a packed one 1.
void check_names(const std::vector<std::string>& names, bool separate) {
  if (names.empty() || names.size() > ATTNCC_MAX_TENSORS || (!separate && names.size() != 1))
    throw std::invalid_argument("attncc launcher: a packed cache is one tensor, a separate one 1.." +
                                std::to_string(ATTNCC_MAX_TENSORS));
}

// What prepare made of each signature seen (at most kMaxSignatures, then all forgotten at once):
// Launcher's and WriteLauncher's memory.
template <class E>
class Memo {
 public:
  // The entry of `sig`, made by make() (Python's prepare) the first time it is seen. A copy of
  // the pointer: Python run later (another thread's prepare) may change the map.
  template <class Make>
  std::shared_ptr<const E> get(Signature&& sig, Make make) {
    auto found = entries_.find(sig);
    if (found == entries_.end()) {
      auto entry = make();
      if (entries_.size() >= kMaxSignatures) entries_.clear();
      found = entries_.insert_or_assign(std::move(sig), std::move(entry)).first;
    }
    return found->second;
  }
  size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  std::unordered_map<Signature, std::shared_ptr<const E>, SignatureHash> entries_;
};

class Launcher {
 public:
  // launch: the library's attncc_launch; tensors: the cache's tensor names in plan order (a
  // separate spec's dict keys), separate: the cache is such a dict; prepare(q, cache, block_table,
  // seqlens, indices, num_splits, out, lse) -> ops.Prepared or None; stream_of(device index) ->
  // the current cudaStream_t; fail(status) raises the launch's error.
  Launcher(uintptr_t launch, std::vector<std::string> tensors, bool separate, py::object prepare,
           py::object stream_of, py::object fail)
      : launch_(reinterpret_cast<LaunchFn>(launch)), names_(std::move(tensors)), separate_(separate),
        prepare_(std::move(prepare)), stream_of_(std::move(stream_of)), fail_(std::move(fail)) {
    check_names(names_, separate_);
  }

  // (out, lse), or None when the call is the Python path's.
  py::object call(py::handle q, py::handle cache, py::handle block_table, py::handle seqlens,
                  py::handle indices, double scale, int64_t num_splits, py::handle out, py::handle lse,
                  py::handle schedule) {
    // a local signature: prepare runs Python, which may let another thread call in meanwhile
    Signature sig;
    sig.reserve(64);
    sig.push_back(num_splits);
    at::Tensor tq, tcache[ATTNCC_MAX_TENSORS], tbt, tlens, tidx, tout, tlse;
    bool ok = !q.is_none() && sign(sig, q, &tq) && sign_cache(sig, cache, names_, separate_, tcache) && sign(sig, block_table, &tbt) &&
              sign(sig, seqlens, &tlens) && sign(sig, indices, &tidx) && sign(sig, out, &tout) && sign(sig, lse, &tlse);
    if (!ok) {  // not tensors where tensors go: prepare raises the argument's error
      prepare_(q, cache, block_table, seqlens, indices, num_splits, out, lse);
      return py::none();
    }
    const std::shared_ptr<const Entry> held =
        entries_.get(std::move(sig), [&] { return make_entry(prepare_(q, cache, block_table, seqlens, indices, num_splits, out, lse)); });
    const Entry& e = *held;
    if (!e.fast) return py::none();
    const c10::Device device = tq.device();
    if (elsewhere(tq)) return py::none();  // q is not on the current device: the Python path switches to it

    if (!tout.defined()) tout = at::empty(e.out_shape, tq.options());
    if (!tlse.defined()) tlse = at::empty(e.lse_shape, tq.options().dtype(at::kFloat));
    if (e.args.batch == 0) return py::make_tuple(tout, tlse);
    at::Tensor workspace;  // partial_out, then partial_lse 16-byte aligned after it: one allocation
    if (e.workspace_floats > 0) workspace = at::empty({e.workspace_floats}, tq.options().dtype(at::kFloat));
    AttnccArgs a = e.args;
    a.q = tq.data_ptr();
    a.out = tout.data_ptr();
    a.lse = static_cast<float*>(tlse.data_ptr());
    for (size_t i = 0; i < names_.size(); ++i) a.tensors[i] = tcache[i].data_ptr();
    a.block_table = tbt.defined() ? static_cast<const int*>(tbt.data_ptr()) : nullptr;
    a.seqlens = tlens.defined() ? static_cast<const int*>(tlens.data_ptr()) : nullptr;
    a.indices = tidx.defined() ? static_cast<const int*>(tidx.data_ptr()) : nullptr;
    a.partial_out = workspace.defined() ? static_cast<float*>(workspace.data_ptr()) : nullptr;
    a.partial_lse = workspace.defined() ? a.partial_out + e.partial_lse_offset : nullptr;
    // the step's schedule (k.plan's, Kernel checked its device; not a part of the signature: a
    // new one each step): the kernels check its key and cut the line themselves where it differs
    a.schedule = nullptr;
    if (!schedule.is_none()) {
      if (!THPVariable_Check(schedule.ptr())) throw std::invalid_argument("attncc launcher: schedule is a tensor or None");
      a.schedule = THPVariable_Unpack(schedule.ptr()).data_ptr();
    }
    a.softmax_scale = static_cast<float>(scale);
    a.stream = reinterpret_cast<void*>(stream_of_(device.index()).cast<uintptr_t>());
    const int status = launch_(&a);
    if (status != 0) {
      fail_(status);  // raises
      return py::none();
    }
    return py::make_tuple(tout, tlse);
  }

  size_t signatures() const { return entries_.size(); }
  void forget() { entries_.clear(); }

 private:
  std::shared_ptr<const Entry> make_entry(py::handle p) const {
    auto made = std::make_shared<Entry>();
    Entry& e = *made;
    if (p.is_none()) return made;
    e.fast = true;
    AttnccArgs& a = e.args;
    a.batch = p.attr("batch").cast<int>();
    a.s_q = p.attr("s_q").cast<int>();
    a.num_splits = p.attr("num_splits").cast<int>();
    a.num_parts = p.attr("num_parts").cast<int>();
    fill_cache(a, p);
    a.block_table_stride = p.attr("block_table_stride").cast<int>();
    a.block_table_cols = p.attr("block_table_cols").cast<int>();
    a.flags = reinterpret_cast<int*>(p.attr("flags").cast<uintptr_t>());
    e.out_shape = shape_of(p.attr("out_shape"));
    e.lse_shape = shape_of(p.attr("lse_shape"));
    py::object workspace = p.attr("workspace");
    if (!workspace.is_none()) {
      e.partial_lse_offset = (elements(shape_of(workspace[py::int_(0)])) + 3) / 4 * 4;
      e.workspace_floats = e.partial_lse_offset + elements(shape_of(workspace[py::int_(1)]));
    }
    return made;
  }

  LaunchFn launch_;
  std::vector<std::string> names_;
  bool separate_;
  py::object prepare_, stream_of_, fail_;
  Memo<Entry> entries_;
};

using WriteFn = int (*)(const AttnccWriteArgs*);

// What ops.prepare_write made of one write_cache signature.
struct WriteEntry {
  bool fast = false;       // false: the Python path takes these calls
  AttnccWriteArgs args{};  // everything but the pointers to the cache, slots and values, and the stream
};

class WriteLauncher {
 public:
  // write: the library's attncc_write_cache; tensors, separate: the cache's, as Launcher's;
  // segments: the spec's segment names in spec order (write_cache's keyword arguments);
  // prepare(cache, slots, values) -> ops.PreparedWrite or None; stream_of, fail: as Launcher's.
  WriteLauncher(uintptr_t write, std::vector<std::string> tensors, bool separate, std::vector<std::string> segments,
                py::object prepare, py::object stream_of, py::object fail)
      : write_(reinterpret_cast<WriteFn>(write)), names_(std::move(tensors)), separate_(separate),
        segments_(std::move(segments)), prepare_(std::move(prepare)), stream_of_(std::move(stream_of)), fail_(std::move(fail)) {
    check_names(names_, separate_);
    if (segments_.empty() || segments_.size() > ATTNCC_MAX_SEGMENTS)
      throw std::invalid_argument("attncc launcher: write_cache writes 1.." + std::to_string(ATTNCC_MAX_SEGMENTS) + " segments");
  }

  // Whether the write was enqueued; false: the Python path takes the call (it raises a bad
  // argument's error, or copies what the kernel cannot read as it is).
  bool call(py::handle cache, py::handle slots, py::handle values) {
    Signature sig;
    sig.reserve(64);
    at::Tensor tcache[ATTNCC_MAX_TENSORS], tslots, tvalues[ATTNCC_MAX_SEGMENTS];
    if (slots.is_none() || !sign_cache(sig, cache, names_, separate_, tcache) || !sign(sig, slots, &tslots) ||
        !sign_dict(sig, values, segments_, tvalues))
      return false;
    const std::shared_ptr<const WriteEntry> held = entries_.get(std::move(sig), [&] { return make_entry(prepare_(cache, slots, values)); });
    if (!held->fast || elsewhere(tslots)) return false;
    AttnccWriteArgs a = held->args;
    for (size_t i = 0; i < names_.size(); ++i) a.tensors[i] = tcache[i].data_ptr();
    a.slots = tslots.data_ptr();
    for (size_t i = 0; i < segments_.size(); ++i) a.values[i] = tvalues[i].data_ptr();
    a.stream = reinterpret_cast<void*>(stream_of_(tslots.device().index()).cast<uintptr_t>());
    const int status = write_(&a);
    if (status != 0) fail_(status);  // raises
    return true;
  }

  size_t signatures() const { return entries_.size(); }
  void forget() { entries_.clear(); }

 private:
  std::shared_ptr<const WriteEntry> make_entry(py::handle p) const {
    auto made = std::make_shared<WriteEntry>();
    if (p.is_none()) return made;
    made->fast = true;
    AttnccWriteArgs& a = made->args;
    fill_cache(a, p);
    a.slots_are_64bit = p.attr("slots_are_64bit").cast<int>();
    a.n = p.attr("n").cast<int>();
    fill(a.value_dtype, p.attr("value_dtype"));
    fill(a.value_token_stride, p.attr("value_token_stride"));
    fill(a.value_head_stride, p.attr("value_head_stride"));
    a.flags = reinterpret_cast<int*>(p.attr("flags").cast<uintptr_t>());
    return made;
  }

  WriteFn write_;
  std::vector<std::string> names_;
  bool separate_;
  std::vector<std::string> segments_;
  py::object prepare_, stream_of_, fail_;
  Memo<WriteEntry> entries_;
};

}  // namespace

PYBIND11_MODULE(attncc_launcher, m) {
  m.doc() = "attncc's compiled launcher (attncc/csrc/launcher.cpp)";
  // what attncc/abi.py's check_abi asks a kernel library, asked of this module too
  m.def("attncc_abi_version", [] { return ATTNCC_ABI_VERSION; });
  m.def("attncc_args_size", [] { return static_cast<int>(sizeof(AttnccArgs)); });
  m.def("attncc_write_args_size", [] { return static_cast<int>(sizeof(AttnccWriteArgs)); });
  py::class_<Launcher>(m, "Launcher")
      .def(py::init<uintptr_t, std::vector<std::string>, bool, py::object, py::object, py::object>(),
           py::arg("launch"), py::arg("tensors"), py::arg("separate"), py::arg("prepare"),
           py::arg("stream_of"), py::arg("fail"))
      .def("__call__", &Launcher::call, py::arg("q"), py::arg("cache"), py::arg("block_table"),
           py::arg("seqlens"), py::arg("indices"), py::arg("scale"), py::arg("num_splits"),
           py::arg("out"), py::arg("lse"), py::arg("schedule") = py::none())
      .def("signatures", &Launcher::signatures, "signatures remembered")
      .def("forget", &Launcher::forget, "forget every signature (the next calls prepare again)");
  py::class_<WriteLauncher>(m, "WriteLauncher")
      .def(py::init<uintptr_t, std::vector<std::string>, bool, std::vector<std::string>, py::object, py::object, py::object>(),
           py::arg("write"), py::arg("tensors"), py::arg("separate"), py::arg("segments"), py::arg("prepare"),
           py::arg("stream_of"), py::arg("fail"))
      .def("__call__", &WriteLauncher::call, py::arg("cache"), py::arg("slots"), py::arg("values"))
      .def("signatures", &WriteLauncher::signatures, "signatures remembered")
      .def("forget", &WriteLauncher::forget, "forget every signature (the next calls prepare again)");
}
