// The planned C++ hot path of an oasr op (docs/architecture.md, "Without CUDA graphs the host decides"), as a host-time
// probe on CPU tensors: benchmarks/host_overhead.py --cpp-probe builds it (g++ against the installed torch) and times
// it beside the Python ops. Not an oasr op: namespace oasr_hostbench_cpp, CPU kernels only, the kernel launch a call
// through a stub function pointer (as the Python harness's stub library).
//
//   gemm(a, w, bias, activation, config, launcher) -> Tensor
//       the hit path the design keeps in C++: the call key (config, M, N, K, bias) looked up in a table of installed
//       plans; a torch-arm plan runs at::addmm / at::mm on the 2-D rows, a kernel plan allocates the output and calls
//       the launcher; a key without a plan raises (the real op would call the Python impl there, which installs it).
//   install(config, m, n, k, bias, kind)          kind 0: torch arm, 1: kernel
//   floor(a, w, launcher) -> Tensor               dispatcher + one empty + one launcher call (the C++ floor)
// The Autograd kernel (AutogradCPU) does inference_only's no-grad test in C++ and redispatches below autograd.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

namespace {

using Launcher = int (*)(const void*, const void*, const void*, void*);

struct Key {
  std::string config;
  int64_t m, n, k;
  bool bias;
  bool operator==(const Key& o) const {
    return m == o.m && n == o.n && k == o.k && bias == o.bias && config == o.config;
  }
};
struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<std::string>()(key.config);
    for (int64_t v : {key.m, key.n, key.k, static_cast<int64_t>(key.bias)}) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
struct Plan {
  int64_t kind;  // 0: torch arm, 1: kernel
  int64_t calls = 0;
};

std::shared_mutex table_mutex;
std::unordered_map<Key, Plan, KeyHash> table;

at::Tensor gemm_cpu(const at::Tensor& a, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                    c10::string_view activation, c10::string_view config, int64_t launcher) {
  TORCH_CHECK(a.dim() == 2 && w.dim() == 2 && a.size(1) == w.size(1), "oasr_hostbench_cpp.gemm: a [M, K], w [N, K]");
  TORCH_CHECK(a.is_contiguous() && w.is_contiguous() && a.scalar_type() == w.scalar_type(), "layout / dtype");
  Key key{std::string(config), a.size(0), w.size(0), w.size(1), bias.has_value()};
  Plan* plan = nullptr;
  {
    std::shared_lock<std::shared_mutex> lock(table_mutex);
    auto it = table.find(key);
    if (it != table.end()) plan = &it->second;
  }
  TORCH_CHECK(plan != nullptr, "oasr_hostbench_cpp.gemm: no plan installed for this key");
  ++plan->calls;  // a probe: the real table would count atomically
  if (plan->kind == 0) {
    return bias.has_value() ? at::addmm(*bias, a, w.t()) : at::mm(a, w.t());
  }
  at::Tensor out = at::empty({a.size(0), w.size(0)}, a.options());
  int rc = reinterpret_cast<Launcher>(launcher)(a.data_ptr(), w.data_ptr(),
                                                bias.has_value() ? bias->data_ptr() : nullptr, out.data_ptr());
  TORCH_CHECK(rc == 0, "launcher failed");
  return out;
}

at::Tensor gemm_autograd(const at::Tensor& a, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                         c10::string_view activation, c10::string_view config, int64_t launcher) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && (a.requires_grad() || w.requires_grad() ||
                                                (bias.has_value() && bias->requires_grad()))),
              "oasr_hostbench_cpp.gemm: no backward (a probe)");
  at::AutoDispatchBelowADInplaceOrView guard;
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("oasr_hostbench_cpp::gemm", "")
                       .typed<decltype(gemm_cpu)>();
  return op.call(a, w, bias, activation, config, launcher);
}

void install(c10::string_view config, int64_t m, int64_t n, int64_t k, bool bias, int64_t kind) {
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  table[Key{std::string(config), m, n, k, bias}] = Plan{kind};
}

at::Tensor floor_cpu(const at::Tensor& a, const at::Tensor& w, int64_t launcher) {
  at::Tensor out = at::empty({a.size(0), w.size(0)}, a.options());
  int rc = reinterpret_cast<Launcher>(launcher)(a.data_ptr(), w.data_ptr(), nullptr, out.data_ptr());
  TORCH_CHECK(rc == 0, "launcher failed");
  return out;
}

}  // namespace

TORCH_LIBRARY(oasr_hostbench_cpp, m) {
  m.def("gemm(Tensor a, Tensor w, Tensor? bias, str activation, str config, int launcher) -> Tensor");
  m.def("install(str config, int m, int n, int k, bool bias, int kind) -> ()");
  m.def("floor(Tensor a, Tensor w, int launcher) -> Tensor");
}

TORCH_LIBRARY_IMPL(oasr_hostbench_cpp, CPU, m) {
  m.impl("gemm", &gemm_cpu);
  m.impl("floor", &floor_cpu);
}

TORCH_LIBRARY_IMPL(oasr_hostbench_cpp, AutogradCPU, m) {
  m.impl("gemm", &gemm_autograd);
}

TORCH_LIBRARY_IMPL(oasr_hostbench_cpp, CompositeExplicitAutograd, m) {
  m.impl("install", &install);
}
