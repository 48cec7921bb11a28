// The C++ hot path of `oasr::gemm` (docs/architecture.md, "Without CUDA graphs the host decides"): built by
// oasr_ops/codegen/host_ext.py with the host C++ compiler against the installed torch, loaded and switched on by
// oasr_ops/families/hot_path.py. Every decision stays in Python; this file only replays decisions already made.
//
// A table maps a call key (config string, dtype, activation, M, N, K, bias, device index) to the plan Python made
// for it (families/gemm/ops.py `_gemm_cuda`): a torch arm (at::linear + the activation, or cuBLASLt's fused
// bias + ReLU) or a kernel (the launcher's C function pointer, split, epilogue code, workspace size). A call whose
// key has a plan and whose operands pass the checks the key does not imply (contiguity, the operands' dtypes and
// devices, the bias shape, 16-byte alignment for a kernel) runs here; any other call goes to the Python
// implementation, registered as `oasr::_gemm_py` at the same backend key, which checks everything, raises or
// makes the plan, runs it and installs it here. So a call never gets an answer the Python path would not give.
//
// Registration is dynamic (`enable_gemm(backend)`): the Python side first removes its own kernel for that key,
// then this file registers `oasr::gemm` at <backend> and Autograd<backend>; `disable()` drops both registrations
// and Python restores its kernel. <backend> is CUDA, or CPU for the CPU suite (stub launchers, no stream).
//
// The Autograd kernel does what families/autograd.py `inference_only` does in Python: without grad, the hit path
// directly when the only key below autograd is the backend; with grad, an autograd Function whose backward raises
// (the op is an inference kernel); anything else (tracing modes, functionalization) redispatches below autograd.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kAbiVersion = 1;  // bump with any change of the ops below (hot_path.py checks it)

// oasr_run of a gemm kernel library (templates/_abi.cu.j2)
using GemmLauncher = int (*)(const void* a, const void* w, const void* bias, void* d, int M, int N, int K,
                             int split_k, int act, void* workspace, size_t workspace_bytes, void* stream);

enum Arm : int64_t { kTorch = 0, kTorchFusedRelu = 1, kKernel = 2 };

struct GemmKey {
  std::string config;
  int64_t m, n, k;
  int8_t dtype, act, device;
  bool bias;
  bool operator==(const GemmKey& o) const {
    return m == o.m && n == o.n && k == o.k && dtype == o.dtype && act == o.act && device == o.device &&
           bias == o.bias && config == o.config;
  }
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const {
    size_t h = std::hash<std::string>()(key.config);
    for (int64_t v : {key.m, key.n, key.k, int64_t(key.dtype) << 24 | int64_t(key.act) << 16 |
                                              int64_t(key.device) << 8 | int64_t(key.bias)}) {
      h = (h ^ std::hash<int64_t>()(v)) * 0x100000001b3ull;
    }
    return h;
  }
};

struct GemmPlan {
  Arm arm;
  GemmLauncher launcher;
  int split, act;
  int64_t workspace_bytes, slot;
  std::string config_id;  // for the error message of a failing launch
  std::atomic<int64_t> calls{0};
};

std::shared_mutex table_mutex;
std::unordered_map<GemmKey, std::unique_ptr<GemmPlan>, GemmKeyHash> gemm_table;
std::vector<GemmPlan*> gemm_slots;  // slot -> plan (owned by gemm_table), for call counts

c10::DispatchKey backend_key = c10::DispatchKey::CUDA;
std::unique_ptr<torch::Library> backend_lib, autograd_lib;

int activation_code(c10::string_view activation) {
  if (activation == "none") return 0;
  if (activation == "relu") return 1;
  if (activation == "gelu") return 2;
  if (activation == "silu") return 3;
  return -1;
}

void* current_stream(const at::Device& device) {
  if (device.type() != c10::DeviceType::CUDA) return nullptr;  // the CPU suite's stub launchers
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStreamNativeHandle(impl->getStream(device));
}

// The hit path: the plan's answer, or nullopt when the call must go to the Python implementation.
std::optional<at::Tensor> gemm_hit(const at::Tensor& a, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                                   c10::string_view activation, c10::string_view config) {
  // What the plan key does not imply (families/gemm/ops.py `_fast_ok`, plus alignment for a kernel below).
  if (w.dim() != 2 || a.dim() < 1) return std::nullopt;
  const int64_t n = w.size(0), k = w.size(1);
  if (n == 0 || k == 0 || a.size(-1) != k) return std::nullopt;
  if (w.scalar_type() != a.scalar_type() || w.device() != a.device()) return std::nullopt;
  if (!a.is_contiguous() || !w.is_contiguous()) return std::nullopt;
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    const at::Tensor& b = *bias;
    if (b.scalar_type() != a.scalar_type() || b.device() != a.device() || b.dim() != 1 || b.size(0) != n ||
        !b.is_contiguous()) {
      return std::nullopt;
    }
  }
  const int act = activation_code(activation);
  if (act < 0) return std::nullopt;
  const int64_t m = a.numel() / k;
  if (m == 0) return std::nullopt;
  GemmKey key{std::string(config), m, n, k, static_cast<int8_t>(a.scalar_type()), static_cast<int8_t>(act),
              static_cast<int8_t>(a.device().index()), has_bias};
  Arm arm;
  GemmLauncher launcher;
  int split, plan_act;
  int64_t ws_bytes;
  {
    std::shared_lock<std::shared_mutex> lock(table_mutex);
    auto it = gemm_table.find(key);
    if (it == gemm_table.end()) return std::nullopt;
    GemmPlan& plan = *it->second;
    if (plan.arm == kKernel) {
      constexpr uintptr_t kAlign = 16;  // TMA descriptors and 128-bit vector loads
      if (reinterpret_cast<uintptr_t>(a.data_ptr()) % kAlign || reinterpret_cast<uintptr_t>(w.data_ptr()) % kAlign ||
          (has_bias && reinterpret_cast<uintptr_t>(bias->data_ptr()) % kAlign)) {
        return std::nullopt;  // Python warns once and serves torch for such calls
      }
    }
    plan.calls.fetch_add(1, std::memory_order_relaxed);
    arm = plan.arm;
    launcher = plan.launcher;
    split = plan.split;
    plan_act = plan.act;
    ws_bytes = plan.workspace_bytes;
  }
  if (arm == kTorchFusedRelu) {
    if (!has_bias) {
      at::Tensor y = at::linear(a, w);
      return at::relu_(y);
    }
    auto out_sizes = a.sizes().vec();
    out_sizes.back() = n;
    return at::_addmm_activation(*bias, a.reshape({m, k}), w.t(), 1, 1, false).view(out_sizes);
  }
  if (arm == kTorch) {
    at::Tensor y = has_bias ? at::linear(a, w, *bias) : at::linear(a, w);
    switch (act) {
      case 1: return at::relu_(y);
      case 2: return at::gelu_(y);
      case 3: return at::silu_(y);
      default: return y;
    }
  }
  c10::DeviceGuard guard(a.device());
  c10::SmallVector<int64_t, 6> out_sizes(a.sizes().begin(), a.sizes().end());
  out_sizes.back() = n;
  at::Tensor out = at::empty(out_sizes, a.options());
  at::Tensor ws = ws_bytes ? at::empty({ws_bytes}, a.options().dtype(at::kByte)) : at::Tensor();
  const int rc = launcher(a.data_ptr(), w.data_ptr(), has_bias ? bias->data_ptr() : nullptr, out.data_ptr(),
                          static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), split, plan_act,
                          ws_bytes ? ws.data_ptr() : nullptr, static_cast<size_t>(ws_bytes), current_stream(a.device()));
  if (rc != 0) {
    std::string id;  // looked up again: the plan may have been cleared since the lock above was released
    {
      std::shared_lock<std::shared_mutex> lock(table_mutex);
      auto it = gemm_table.find(key);
      id = it == gemm_table.end() ? std::string("?") : it->second->config_id;
    }
    TORCH_CHECK(false, "oasr.gemm: kernel ", id, " failed with status ", rc, " on M=", m, " N=", n, " K=", k);
  }
  return out;
}

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                          c10::string_view, c10::string_view)>&
gemm_op(const char* name) {
  using Sig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                         c10::string_view);
  static auto gemm = c10::Dispatcher::singleton().findSchemaOrThrow("oasr::gemm", "").typed<Sig>();
  static auto python = c10::Dispatcher::singleton().findSchemaOrThrow("oasr::_gemm_py", "").typed<Sig>();
  return name[0] == 'g' ? gemm : python;
}

// The backend kernel: the hit path, else the Python implementation at the same key.
at::Tensor gemm_backend(const at::Tensor& a, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                        c10::string_view activation, c10::string_view config) {
  if (auto out = gemm_hit(a, w, bias, activation, config)) return *std::move(out);
  return gemm_op("_gemm_py").redispatch(c10::DispatchKeySet(backend_key), a, w, bias, activation, config);
}

struct GemmNoBackward : public torch::autograd::Function<GemmNoBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& a, const at::Tensor& w,
                            const std::optional<at::Tensor>& bias, const std::string& activation,
                            const std::string& config) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return gemm_op("gemm").call(a, w, bias, activation, config);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    TORCH_CHECK(false, "oasr.gemm has no backward (an inference kernel): run it under torch.no_grad() or "
                       "torch.inference_mode(), or use the aten op it replaces where gradients are needed");
  }
};

at::Tensor gemm_autograd(c10::DispatchKeySet keys, const at::Tensor& a, const at::Tensor& w,
                         const std::optional<at::Tensor>& bias, c10::string_view activation, c10::string_view config) {
  if (c10::GradMode::is_enabled() &&
      (a.requires_grad() || w.requires_grad() || (bias.has_value() && bias->defined() && bias->requires_grad()))) {
    return GemmNoBackward::apply(a, w, bias, std::string(activation), std::string(config));
  }
  if ((keys & c10::after_ADInplaceOrView_keyset) == c10::DispatchKeySet(backend_key)) {
    return gemm_backend(a, w, bias, activation, config);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return gemm_op("gemm").redispatch(keys & c10::after_autograd_keyset, a, w, bias, activation, config);
}

// ---------------------------------------------------------------------------------- control ops (Python side)

int64_t abi_version() { return kAbiVersion; }

void enable_gemm(c10::string_view backend) {
  TORCH_CHECK(backend == "CUDA" || backend == "CPU", "oasr_hot.enable_gemm: backend must be CUDA or CPU");
  TORCH_CHECK(!backend_lib, "oasr_hot.enable_gemm: already enabled");
  const bool cuda = backend == "CUDA";
  backend_key = cuda ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  backend_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "oasr", backend_key, __FILE__, __LINE__);
  backend_lib->impl("gemm", TORCH_FN(gemm_backend));
  autograd_lib = std::make_unique<torch::Library>(
      torch::Library::IMPL, "oasr", cuda ? c10::DispatchKey::AutogradCUDA : c10::DispatchKey::AutogradCPU, __FILE__,
      __LINE__);
  autograd_lib->impl("gemm", TORCH_FN(gemm_autograd));
}

void disable() {
  autograd_lib.reset();  // the destructor removes the registration
  backend_lib.reset();
}

void install_gemm(c10::string_view config, c10::ScalarType dtype, int64_t act, int64_t m, int64_t n, int64_t k,
                  bool bias, int64_t device, int64_t arm, int64_t launcher, int64_t split, int64_t workspace_bytes,
                  int64_t slot, c10::string_view config_id) {
  TORCH_CHECK(arm >= kTorch && arm <= kKernel, "oasr_hot.install_gemm: bad arm ", arm);
  TORCH_CHECK(arm != kKernel || launcher != 0, "oasr_hot.install_gemm: a kernel plan needs its launcher");
  TORCH_CHECK(act >= 0 && act <= 3 && m > 0 && n > 0 && k > 0 && m <= INT32_MAX && n <= INT32_MAX &&
                  k <= INT32_MAX && device >= -1 && device < 127 && workspace_bytes >= 0,
              "oasr_hot.install_gemm: key out of range");
  auto plan = std::make_unique<GemmPlan>();
  plan->arm = static_cast<Arm>(arm);
  plan->launcher = reinterpret_cast<GemmLauncher>(static_cast<uintptr_t>(launcher));
  plan->split = static_cast<int>(split);
  plan->act = static_cast<int>(act);
  plan->workspace_bytes = workspace_bytes;
  plan->slot = slot;
  plan->config_id = std::string(config_id);
  GemmKey key{std::string(config), m, n, k, static_cast<int8_t>(dtype), static_cast<int8_t>(act),
              static_cast<int8_t>(device), bias};
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto& entry = gemm_table[key];
  if (entry) return;  // installed already (two threads missed at once): keep the first, its slot counts
  gemm_slots.push_back(plan.get());
  entry = std::move(plan);
}

// (slot, calls) pairs, flattened, for every plan called since the last drain; the counts restart at zero.
std::vector<int64_t> drain_calls() {
  std::vector<int64_t> out;
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  for (GemmPlan* plan : gemm_slots) {
    const int64_t n = plan->calls.exchange(0, std::memory_order_relaxed);
    if (n) {
      out.push_back(plan->slot);
      out.push_back(n);
    }
  }
  return out;
}

int64_t clear() {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  const int64_t n = static_cast<int64_t>(gemm_table.size());
  gemm_slots.clear();
  gemm_table.clear();
  return n;
}

int64_t size() {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  return static_cast<int64_t>(gemm_table.size());
}

}  // namespace

TORCH_LIBRARY(oasr_hot, m) {
  m.def("abi_version() -> int", &abi_version);
  m.def("enable_gemm(str backend) -> ()", &enable_gemm);
  m.def("disable() -> ()", &disable);
  m.def("install_gemm(str config, ScalarType dtype, int act, int m, int n, int k, bool bias, int device, int arm, "
        "int launcher, int split, int workspace_bytes, int slot, str config_id) -> ()",
        &install_gemm);
  m.def("drain_calls() -> int[]", &drain_calls);
  m.def("clear() -> int", &clear);
  m.def("size() -> int", &size);
}
