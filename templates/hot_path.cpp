// The C++ hot path of the oasr ops a served model calls most (docs/architecture.md, "Without CUDA graphs the host
// decides"): `oasr::gemm`, the int8 GEMMs `oasr::scaled_mm`, `scaled_mm_quant`, `scaled_mm_act_quant`,
// `scaled_mm_residual`, their fp8 e4m3 counterparts `oasr::scaled_mm_fp8`, `scaled_mm_fp8_quant`,
// `scaled_mm_fp8_act_quant`, `scaled_mm_fp8_residual` (the same launcher ABI), `oasr::conv1d_depthwise` and
// `oasr::layer_norm_quant`. Built by oasr_ops/codegen/host_ext.py
// with the host C++ compiler against the installed torch, loaded and switched on by oasr_ops/families/hot_path.py.
// Every decision stays in Python; this file only replays decisions already made.
//
// One table maps a call key (op, config string, and the integers the Python plan cache keys the call by: dtypes,
// shapes, bias or not, devices) to the plan Python made for it (each family's `_cuda`): for gemm a torch arm
// (at::linear + the activation, or cuBLASLt's fused bias + ReLU) or a kernel; for the others a kernel only (their
// torch arms are Python reference code, left to Python). A kernel plan holds the launcher's C function pointer and
// the launch constants (workspace size, split, alignment rules). A call whose key has a plan and whose operands pass
// the checks the key does not imply (each family's `fast_ok`: contiguity, dtypes and devices of the operands the key
// leaves out, scale and bias shapes, pointer alignment for a kernel, and for a quantizing op an `out_scale` whose
// values Python has checked at its current version) runs here; any other call goes to the op's Python
// implementation, registered as `oasr::_<op>_py` at the same backend key, which checks everything, raises or makes
// the plan, runs it and installs it here. So a call never gets an answer the Python path would not give.
//
// Registration is dynamic (`enable(backend, ops)`): the Python side first removes its own kernel of each op for
// that key, then this file registers the ops at <backend> and Autograd<backend>; `disable()` drops the
// registrations and Python restores its kernels. <backend> is CUDA, or CPU for the CPU suite (stub launchers, no
// stream).
//
// The Autograd kernels do what families/autograd.py `inference_only` does in Python: without grad, the hit path
// directly when the only key below autograd is the backend; with grad, an autograd Function whose backward raises
// (the ops are inference kernels); anything else (tracing modes, functionalization) redispatches below autograd.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kAbiVersion = 4;  // bump with any change of the ops below (codegen/host_ext.py checks it)

// The ops served here; the codes are families/hot_path.py `OPS`.
enum Op : int64_t { kGemm = 0, kScaledMm, kScaledMmQuant, kScaledMmActQuant, kScaledMmResidual, kConv1dDepthwise,
                    kLayerNormQuant, kScaledMmFp8, kScaledMmFp8Quant, kScaledMmFp8ActQuant, kScaledMmFp8Residual,
                    kNumOps };
constexpr const char* kOpNames[kNumOps] = {"gemm", "scaled_mm", "scaled_mm_quant", "scaled_mm_act_quant",
                                           "scaled_mm_residual", "conv1d_depthwise", "layer_norm_quant",
                                           "scaled_mm_fp8", "scaled_mm_fp8_quant", "scaled_mm_fp8_act_quant",
                                           "scaled_mm_fp8_residual"};

// The launchers' C ABI (templates/_abi.cu.j2, _scaled_mm_abi.cu.j2, conv1d_depthwise.cu.j2,
// layer_norm_quant.cu.j2): `oasr_run`, `oasr_smm_run` (x = out_scale, x_arg = its per-row flag), `oasr_smmr_run`
// (x = residual, x_arg = alpha), `oasr_dwconv_run`, `oasr_lnq_run`.
using GemmLauncher = int (*)(const void* a, const void* w, const void* bias, void* d, int M, int N, int K,
                             int split_k, int act, void* workspace, size_t workspace_bytes, void* stream);
using SmmLauncher = int (*)(const void* a, const void* w, const void* sa, int sa_per_row, const void* sw,
                            int sw_per_col, const void* bias, const void* x, int x_arg, void* out, int M, int N, int K,
                            void* workspace, size_t workspace_bytes, void* stream);
using SmmrLauncher = int (*)(const void* a, const void* w, const void* sa, int sa_per_row, const void* sw,
                             int sw_per_col, const void* bias, const void* x, float x_arg, void* out, int M, int N,
                             int K, void* workspace, size_t workspace_bytes, void* stream);
using DwconvLauncher = int (*)(const void* x, const void* w, int w_fp32, const void* bias, int bias_fp32, void* out,
                               int B, int T, int C, int Kw, int act, int glu, void* workspace, size_t workspace_bytes,
                               void* stream);
using LnqLauncher = int (*)(const void* x, const void* w, int w_f32, const void* b, int b_f32, void* q, void* scale,
                            void* y, int M, int N, float eps, void* stream);

enum Arm : int64_t { kTorch = 0, kTorchFusedRelu = 1, kKernel = 2 };
using Ints = c10::SmallVector<int64_t, 24>;

struct PlanKey {
  int64_t op;
  std::string config;
  Ints ints;  // what the op's Python plan key holds besides the config (hot_path.py documents each op's list)
  bool operator==(const PlanKey& o) const { return op == o.op && ints == o.ints && config == o.config; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = std::hash<std::string>()(key.config) ^ static_cast<size_t>(key.op);
    for (int64_t v : key.ints) h = (h ^ std::hash<int64_t>()(v)) * 0x100000001b3ull;
    return h;
  }
};

struct Plan {
  Arm arm;
  void* launcher;
  c10::SmallVector<int64_t, 8> params;  // the launch constants (hot_path.py documents each op's list)
  int64_t slot;
  std::string config_id;  // for the error message of a failing launch
  std::atomic<int64_t> calls{0};
};

// What a hit copies out of the table, and the plan's shared ownership (the table may drop it once the lock is
// released): `answered()` counts the call, once the hit path has answered it rather than handing it to Python.
struct Found {
  Arm arm;
  void* launcher;
  c10::SmallVector<int64_t, 8> params;
  std::shared_ptr<Plan> plan;
  void answered() const { plan->calls.fetch_add(1, std::memory_order_relaxed); }
};

std::shared_mutex table_mutex;
std::unordered_map<PlanKey, std::shared_ptr<Plan>, PlanKeyHash> table;
std::vector<Plan*> slots;  // slot -> plan (owned by table), for call counts

c10::DispatchKey backend_key = c10::DispatchKey::CUDA;
std::vector<std::unique_ptr<torch::Library>> libraries;  // the registrations enable() made

// The plan of `key`; its call is counted by the hit path (`Found::answered`) once it has answered it.
std::optional<Found> find_plan(const PlanKey& key) {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(key);
  if (it == table.end()) return std::nullopt;
  const Plan& plan = *it->second;
  return Found{plan.arm, plan.launcher, plan.params, it->second};
}

std::string config_id_of(const PlanKey& key) {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  auto it = table.find(key);
  return it == table.end() ? std::string("?") : it->second->config_id;
}

int64_t device_code(const at::Device& device) {  // type and index in one integer (hot_path.py `device_code`)
  return static_cast<int64_t>(device.type()) * 256 + device.index() + 1;
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void* current_stream(const at::Device& device) {
  if (device.type() != c10::DeviceType::CUDA) return nullptr;  // the CPU suite's stub launchers
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStreamNativeHandle(impl->getStream(device));
}

[[noreturn]] void launch_failed(const char* op, const PlanKey& key, int rc, int64_t m, int64_t n, int64_t k) {
  TORCH_CHECK(false, "oasr.", op, ": kernel ", config_id_of(key), " failed with status ", rc, " on M=", m, " N=", n,
              " K=", k);
}

// ---------------------------------------------------------------------------------- out_scale values checked

// A quantizing op reads its out_scale only once Python has checked its values (scaled_mm/out_scale.py: finite and
// > 0; reading them synchronizes the device). Python reports each passing check here: the storage (held weakly: its
// address stays unique while the entry lives), the data pointer, the size and the version of the tensor checked.
// A tensor without a version counter (made in inference mode) is never taken from here: Python checks it per call.
struct ScaleKey {
  const c10::StorageImpl* storage;
  const void* ptr;
  int64_t numel;
  bool operator==(const ScaleKey& o) const { return storage == o.storage && ptr == o.ptr && numel == o.numel; }
};
struct ScaleKeyHash {
  size_t operator()(const ScaleKey& k) const {
    return std::hash<const void*>()(k.storage) ^ (std::hash<const void*>()(k.ptr) * 31) ^ std::hash<int64_t>()(k.numel);
  }
};
struct ScaleSeen {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t version;
};
std::shared_mutex scale_mutex;
std::unordered_map<ScaleKey, ScaleSeen, ScaleKeyHash> scales_checked;

bool out_scale_checked(const at::Tensor& t) {
  if (t.is_inference() || !t.has_storage()) return false;
  const int64_t version = t._version();
  std::shared_lock<std::shared_mutex> lock(scale_mutex);
  auto it = scales_checked.find(ScaleKey{t.storage().unsafeGetStorageImpl(), t.data_ptr(), t.numel()});
  return it != scales_checked.end() && it->second.version == version && !it->second.storage.expired();
}

void out_scale_passed(const at::Tensor& t) {
  if (t.is_inference() || !t.has_storage()) return;
  const int64_t version = t._version();
  std::unique_lock<std::shared_mutex> lock(scale_mutex);
  if (scales_checked.size() >= 4096) {  // storages freed since: drop their entries
    for (auto it = scales_checked.begin(); it != scales_checked.end();) {
      it = it->second.storage.expired() ? scales_checked.erase(it) : std::next(it);
    }
  }
  scales_checked.insert_or_assign(ScaleKey{t.storage().unsafeGetStorageImpl(), t.data_ptr(), t.numel()},
                                  ScaleSeen{t.storage().getWeakStorageImpl(), version});
}

// ---------------------------------------------------------------------------------- oasr::gemm

int gemm_activation_code(c10::string_view activation) {  // families/gemm/ops.py ACTIVATIONS
  if (activation == "none") return 0;
  if (activation == "relu") return 1;
  if (activation == "gelu") return 2;
  if (activation == "silu") return 3;
  return -1;
}

// Key ints: dtype, activation, M, N, K, bias, device. Params: split, activation, workspace bytes.
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
  const int act = gemm_activation_code(activation);
  if (act < 0) return std::nullopt;
  const int64_t m = a.numel() / k;
  if (m == 0) return std::nullopt;
  PlanKey key{kGemm, std::string(config),
              {static_cast<int64_t>(a.scalar_type()), act, m, n, k, has_bias, device_code(a.device())}};
  auto found = find_plan(key);
  if (!found) return std::nullopt;
  if (found->arm != kKernel) found->answered();  // a torch arm always answers; a kernel once its operands align
  if (found->arm == kTorchFusedRelu) {
    if (!has_bias) {
      at::Tensor y = at::linear(a, w);
      return at::relu_(y);
    }
    auto out_sizes = a.sizes().vec();
    out_sizes.back() = n;
    return at::_addmm_activation(*bias, a.reshape({m, k}), w.t(), 1, 1, false).view(out_sizes);
  }
  if (found->arm == kTorch) {
    at::Tensor y;
    if (a.dim() == 2 || a.dim() == 3) {
      // What at::linear runs for a contiguous 2-D or 3-D operand (addmm / mm on the rows: the same cuBLAS call, so
      // the same bits as the Python op's F.linear) without its composite hop; other ranks take at::linear itself
      // (for those it adds the bias separately).
      const at::Tensor a2 = a.dim() == 2 ? a : a.view({m, k});
      y = has_bias ? at::addmm(*bias, a2, w.t()) : at::mm(a2, w.t());
      if (a.dim() == 3) y = y.view({a.size(0), a.size(1), n});
    } else {
      y = has_bias ? at::linear(a, w, *bias) : at::linear(a, w);
    }
    switch (act) {
      case 1: return at::relu_(y);
      case 2: return at::gelu_(y);
      case 3: return at::silu_(y);
      default: return y;
    }
  }
  constexpr uintptr_t kAlign = 16;  // TMA descriptors and 128-bit vector loads
  if (!aligned(a.data_ptr(), kAlign) || !aligned(w.data_ptr(), kAlign) ||
      (has_bias && !aligned(bias->data_ptr(), kAlign))) {
    return std::nullopt;  // Python warns once and serves torch for such calls (and counts them)
  }
  found->answered();
  const int split = static_cast<int>(found->params[0]), plan_act = static_cast<int>(found->params[1]);
  const int64_t ws_bytes = found->params[2];
  c10::DeviceGuard guard(a.device());
  c10::SmallVector<int64_t, 6> out_sizes(a.sizes().begin(), a.sizes().end());
  out_sizes.back() = n;
  at::Tensor out = at::empty(out_sizes, a.options());
  at::Tensor ws = ws_bytes ? at::empty({ws_bytes}, a.options().dtype(at::kByte)) : at::Tensor();
  const int rc = reinterpret_cast<GemmLauncher>(found->launcher)(
      a.data_ptr(), w.data_ptr(), has_bias ? bias->data_ptr() : nullptr, out.data_ptr(), static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(k), split, plan_act, ws_bytes ? ws.data_ptr() : nullptr,
      static_cast<size_t>(ws_bytes), current_stream(a.device()));
  if (rc != 0) launch_failed("gemm", key, rc, m, n, k);
  return out;
}

// ---------------------------------------------------------------------------------- the int8 and fp8 scaled GEMMs

// families/scaled_mm/ops.py `_vec_ok`: fp32, 1-D, [1] or [full], on the device, contiguous
bool vec_ok(const at::Tensor& t, int64_t full, const at::Device& device) {
  return t.defined() && t.scalar_type() == at::kFloat && t.dim() == 1 && (t.size(0) == 1 || t.size(0) == full) &&
         t.device() == device && t.is_contiguous();
}

// The bias field of a scaled_mm_act_quant key (families/scaled_mm/act_quant.py `_BIAS_CODES`): its kernels read an
// fp32, fp16 or bf16 bias (a kernel variant each); -1: none of them.
int64_t act_quant_bias_code(at::ScalarType t) {
  if (t == at::kFloat) return 1;
  if (t == at::kHalf) return 2;
  if (t == at::kBFloat16) return 3;
  return -1;
}

// One hit path for scaled_mm, scaled_mm_quant, scaled_mm_act_quant and scaled_mm_residual, and for their fp8
// counterparts (families/scaled_mm_fp8: the same checks with e4m3 operands, an e4m3 quantized output, and an fp32
// bias on the activation-quantizing op). `variant` is what their Python plan key holds beside the shape: the out
// dtype (scaled_mm[_fp8], scaled_mm[_fp8]_residual), the activation (scaled_mm[_fp8]_act_quant), nothing
// (scaled_mm[_fp8]_quant). `extra`: out_scale (quantizing ops) or the residual. `out_dtype`: the 16-bit output's
// dtype (a quantizing op writes its operands' dtype and ignores it).
// Key ints: variant, M, N, K, bias, device. Params: workspace bytes, scale/bias vector alignment in bytes, whether
// a per-tensor scale_w is expanded to [N] first (the 2.x kernels read it as float4 vectors).
std::optional<at::Tensor> scaled_mm_hit(Op op, const at::Tensor& a, const at::Tensor& w, const at::Tensor& scale_a,
                                        const at::Tensor& scale_w, const std::optional<at::Tensor>& bias,
                                        const at::Tensor* extra, double alpha, at::ScalarType out_dtype,
                                        int64_t variant, c10::string_view config) {
  // families/scaled_mm/checks.py `fast_ok` (and residual.py `fast_ok`, act_quant.py's out_scale check)
  const bool fp8 = op == kScaledMmFp8 || op == kScaledMmFp8Quant || op == kScaledMmFp8ActQuant ||
                   op == kScaledMmFp8Residual;
  const at::ScalarType element = fp8 ? at::kFloat8_e4m3fn : at::kChar;
  if (a.scalar_type() != element || w.scalar_type() != element || w.dim() != 2 || a.dim() < 1) {
    return std::nullopt;
  }
  const int64_t n = w.size(0), k = w.size(1);
  if (n == 0 || k == 0 || a.size(-1) != k) return std::nullopt;
  const at::Device device = a.device();
  if (w.device() != device || !a.is_contiguous() || !w.is_contiguous()) return std::nullopt;
  const int64_t m = a.numel() / k;
  if (m == 0 || !vec_ok(scale_a, m, device) || !vec_ok(scale_w, n, device)) return std::nullopt;
  const bool quant = op == kScaledMmQuant || op == kScaledMmActQuant || op == kScaledMmFp8Quant ||
                     op == kScaledMmFp8ActQuant;
  const bool residual = op == kScaledMmResidual || op == kScaledMmFp8Residual;
  const bool has_bias = bias.has_value() && bias->defined();
  int64_t bias_code = 0;  // the key's bias field: 0 none, 1 a bias (of the op's one bias dtype), or act-quant's code
  if (has_bias) {
    const at::Tensor& b = *bias;
    bias_code = op == kScaledMmActQuant ? act_quant_bias_code(b.scalar_type())
                                        : (b.scalar_type() == (quant ? at::kFloat : out_dtype) ? 1 : -1);
    if (bias_code < 0 || b.dim() != 1 || b.size(0) != n || b.device() != device || !b.is_contiguous()) {
      return std::nullopt;
    }
  }
  if (quant && !(vec_ok(*extra, m, device) && out_scale_checked(*extra))) return std::nullopt;
  if (residual) {
    const at::Tensor& r = *extra;
    if (!r.defined() || r.scalar_type() != out_dtype || r.device() != device || !r.is_contiguous() ||
        r.dim() != a.dim() || r.size(-1) != n ||
        !std::equal(r.sizes().begin(), r.sizes().end() - 1, a.sizes().begin())) {
      return std::nullopt;
    }
    if (!std::isfinite(alpha) || std::abs(alpha) > static_cast<double>(FLT_MAX)) return std::nullopt;
  }
  PlanKey key{op, std::string(config), {variant, m, n, k, bias_code, device_code(device)}};
  auto found = find_plan(key);
  if (!found || found->arm != kKernel) return std::nullopt;
  const int64_t ws_bytes = found->params[0];
  const uintptr_t vec_align = static_cast<uintptr_t>(found->params[1]);
  at::Tensor sw = scale_w;
  if (found->params[2] && sw.numel() == 1 && n > 1) sw = sw.expand({n}).contiguous();
  if (!aligned(a.data_ptr(), 16) || !aligned(w.data_ptr(), 16) || !aligned(sw.data_ptr(), vec_align) ||
      (has_bias && !aligned(bias->data_ptr(), vec_align)) ||
      (residual && !aligned(extra->data_ptr(), 16))) {
    return std::nullopt;  // Python warns once and serves its reference for such calls (and counts them)
  }
  found->answered();
  c10::DeviceGuard guard(device);
  c10::SmallVector<int64_t, 6> out_sizes(a.sizes().begin(), a.sizes().end());
  out_sizes.back() = n;
  at::Tensor out = at::empty(out_sizes, a.options().dtype(quant ? element : out_dtype));
  at::Tensor ws = ws_bytes ? at::empty({ws_bytes}, a.options().dtype(at::kByte)) : at::Tensor();
  const int sa_per_row = scale_a.numel() != 1 || m == 1, sw_per_col = sw.numel() != 1 || n == 1;
  const void* bias_ptr = has_bias ? bias->data_ptr() : nullptr;
  void* ws_ptr = ws_bytes ? ws.data_ptr() : nullptr;
  void* stream = current_stream(device);
  int rc;
  if (residual) {
    rc = reinterpret_cast<SmmrLauncher>(found->launcher)(
        a.data_ptr(), w.data_ptr(), scale_a.data_ptr(), sa_per_row, sw.data_ptr(), sw_per_col, bias_ptr,
        extra->data_ptr(), static_cast<float>(alpha), out.data_ptr(), static_cast<int>(m), static_cast<int>(n),
        static_cast<int>(k), ws_ptr, static_cast<size_t>(ws_bytes), stream);
  } else {
    const void* x = quant ? extra->data_ptr() : nullptr;
    const int x_arg = quant && extra->numel() != 1;
    rc = reinterpret_cast<SmmLauncher>(found->launcher)(
        a.data_ptr(), w.data_ptr(), scale_a.data_ptr(), sa_per_row, sw.data_ptr(), sw_per_col, bias_ptr, x, x_arg,
        out.data_ptr(), static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), ws_ptr,
        static_cast<size_t>(ws_bytes), stream);
  }
  if (rc != 0) launch_failed(kOpNames[op], key, rc, m, n, k);
  return out;
}

int act_quant_code(c10::string_view activation) {  // families/scaled_mm/act_quant.py ACTIVATIONS, coded as gemm's
  if (activation == "gelu") return 2;
  if (activation == "silu") return 3;
  return -1;
}

// ---------------------------------------------------------------------------------- oasr::conv1d_depthwise

// Key ints (families/conv1d/ops.py `_cuda`'s key): x dtype, w dtype, bias (-1, or its dtype, rank, sizes, device),
// x rank and sizes, w rank and sizes, padding, layout (0 bct, 1 btc), activation (0 none, 1 silu), glu, x's device,
// w's device. Params: B, T, C, Kw, the kernel's activation code, glu.
std::optional<at::Tensor> conv1d_hit(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                                     int64_t padding, c10::string_view layout, c10::string_view activation,
                                     c10::string_view config, bool glu) {
  const int64_t layout_code = layout == "bct" ? 0 : layout == "btc" ? 1 : -1;
  const int64_t act = activation == "none" ? 0 : activation == "silu" ? 1 : -1;
  if (layout_code < 0 || act < 0 || x.dim() != 3 || w.dim() != 3) return std::nullopt;
  const bool has_bias = bias.has_value() && bias->defined();
  Ints ints{static_cast<int64_t>(x.scalar_type()), static_cast<int64_t>(w.scalar_type())};
  if (has_bias) {
    ints.append({static_cast<int64_t>(bias->scalar_type()), bias->dim()});
    ints.append(bias->sizes().begin(), bias->sizes().end());
    ints.push_back(device_code(bias->device()));
  } else {
    ints.push_back(-1);
  }
  ints.push_back(3);
  ints.append(x.sizes().begin(), x.sizes().end());
  ints.push_back(3);
  ints.append(w.sizes().begin(), w.sizes().end());
  ints.append({padding, layout_code, act, glu, device_code(x.device()), device_code(w.device())});
  PlanKey key{kConv1dDepthwise, std::string(config), std::move(ints)};
  auto found = find_plan(key);
  if (!found || found->arm != kKernel) return std::nullopt;
  found->answered();
  const auto& p = found->params;  // B, T, C, Kw, act, glu
  const int64_t c = p[2], kw = p[3];
  c10::DeviceGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor w2 = w.reshape({c, kw});
  if (!w2.is_contiguous()) w2 = w2.contiguous();
  at::Tensor b;
  if (has_bias) b = bias->is_contiguous() ? *bias : bias->contiguous();
  c10::SmallVector<int64_t, 3> out_sizes(x.sizes().begin(), x.sizes().end());
  if (glu) out_sizes[layout_code == 0 ? 1 : 2] /= 2;
  at::Tensor out = at::empty(out_sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  const int rc = reinterpret_cast<DwconvLauncher>(found->launcher)(
      xc.data_ptr(), w2.data_ptr(), w2.scalar_type() == at::kFloat, has_bias ? b.data_ptr() : nullptr,
      has_bias && b.scalar_type() == at::kFloat, out.data_ptr(), static_cast<int>(p[0]), static_cast<int>(p[1]),
      static_cast<int>(c), static_cast<int>(kw), static_cast<int>(p[4]), static_cast<int>(p[5]), nullptr, 0,
      current_stream(x.device()));
  if (rc != 0) {
    TORCH_CHECK(false, "oasr.conv1d_depthwise: kernel ", config_id_of(key), " failed with status ", rc, " on B=",
                p[0], " T=", p[1], " C=", c, " Kw=", kw);
  }
  return out;
}

// ---------------------------------------------------------------------------------- oasr::layer_norm_quant

using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// A LayerNorm weight or bias as a key integer (families/layer_norm_quant/ops.py `_check`): -1 none, its dtype when
// it is a contiguous [N] vector on x's device (a plan exists only for dtypes Python accepted), -2 anything else
// (not taken here: Python raises).
int64_t lnq_vector_code(const std::optional<at::Tensor>& t, int64_t n, const at::Device& device) {
  if (!t.has_value() || !t->defined()) return -1;
  if (t->dim() != 1 || t->size(0) != n || t->device() != device || !t->is_contiguous()) return -2;
  return static_cast<int64_t>(t->scalar_type());
}

// Key ints: x dtype, M, N, weight code, bias code, normalized, scheme (0 int8, 1 fp8), eps's bits, x's device. No
// params: the launcher checks its own problem (the plan's config is in the library).
std::optional<Tensor3> layer_norm_quant_hit(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                            const std::optional<at::Tensor>& bias, double eps, bool normalized,
                                            c10::string_view scheme, c10::string_view config) {
  const int64_t scheme_code = scheme == "int8" ? 0 : scheme == "fp8" ? 1 : -1;
  if (scheme_code < 0 || x.dim() < 1 || !x.is_contiguous()) return std::nullopt;
  const int64_t n = x.size(-1);
  if (n == 0) return std::nullopt;
  const int64_t m = x.numel() / n;
  if (m == 0) return std::nullopt;
  const at::Device device = x.device();
  const int64_t w_code = lnq_vector_code(weight, n, device), b_code = lnq_vector_code(bias, n, device);
  if (w_code == -2 || b_code == -2) return std::nullopt;
  int64_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  PlanKey key{kLayerNormQuant, std::string(config),
              {static_cast<int64_t>(x.scalar_type()), m, n, w_code, b_code, normalized, scheme_code, eps_bits,
               device_code(device)}};
  auto found = find_plan(key);
  if (!found || found->arm != kKernel) return std::nullopt;
  c10::DeviceGuard guard(device);
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(scheme_code ? at::kFloat8_e4m3fn : at::kChar));
  at::Tensor scale = at::empty({m}, x.options().dtype(at::kFloat));
  at::Tensor y = normalized ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  const bool has_w = w_code >= 0, has_b = b_code >= 0;
  const int rc = reinterpret_cast<LnqLauncher>(found->launcher)(
      x.data_ptr(), has_w ? weight->data_ptr() : nullptr, has_w && w_code == static_cast<int64_t>(at::kFloat),
      has_b ? bias->data_ptr() : nullptr, has_b && b_code == static_cast<int64_t>(at::kFloat), q.data_ptr(),
      scale.data_ptr(), normalized ? y.data_ptr() : nullptr, static_cast<int>(m), static_cast<int>(n),
      static_cast<float>(eps), current_stream(device));
  // 1: a row the kernel's unaligned instantiation cannot hold, refused before any launch: Python warns once and runs
  // the reference for such calls
  if (rc == 1) return std::nullopt;
  if (rc != 0) {
    TORCH_CHECK(false, "oasr.layer_norm_quant: kernel ", config_id_of(key), " failed with status ", rc, " on M=", m,
                " N=", n);
  }
  found->answered();
  return Tensor3(std::move(q), std::move(scale), std::move(y));
}

// Each op's hit path with the op's schema (the argument types torch passes a kernel of it), one template per schema:
// kOp is the int8 op or its fp8 counterpart. (A quantizing op's output dtype is its operands', in scaled_mm_hit.)
template <Op kOp>
std::optional<at::Tensor> scaled_mm_op_hit(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scale_a,
                                           const at::Tensor& scale_w, const std::optional<at::Tensor>& bias,
                                           at::ScalarType out_dtype, c10::string_view config) {
  return scaled_mm_hit(kOp, a, w, scale_a, scale_w, bias, nullptr, 0.0, out_dtype, static_cast<int64_t>(out_dtype),
                       config);
}

template <Op kOp>
std::optional<at::Tensor> scaled_mm_quant_hit(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scale_a,
                                              const at::Tensor& scale_w, const std::optional<at::Tensor>& bias,
                                              const at::Tensor& out_scale, c10::string_view config) {
  return scaled_mm_hit(kOp, a, w, scale_a, scale_w, bias, &out_scale, 0.0, at::kFloat, 0, config);
}

template <Op kOp>
std::optional<at::Tensor> scaled_mm_act_quant_hit(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scale_a,
                                                  const at::Tensor& scale_w, const std::optional<at::Tensor>& bias,
                                                  const at::Tensor& out_scale, c10::string_view activation,
                                                  c10::string_view config) {
  const int act = act_quant_code(activation);
  if (act < 0) return std::nullopt;
  return scaled_mm_hit(kOp, a, w, scale_a, scale_w, bias, &out_scale, 0.0, at::kFloat, act, config);
}

template <Op kOp>
std::optional<at::Tensor> scaled_mm_residual_hit(const at::Tensor& a, const at::Tensor& w, const at::Tensor& scale_a,
                                                 const at::Tensor& scale_w, const std::optional<at::Tensor>& bias,
                                                 const at::Tensor& residual, double alpha, at::ScalarType out_dtype,
                                                 c10::string_view config) {
  return scaled_mm_hit(kOp, a, w, scale_a, scale_w, bias, &residual, alpha, out_dtype,
                       static_cast<int64_t>(out_dtype), config);
}

// ---------------------------------------------------------------------------------- the dispatcher kernels

bool needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
bool needs_grad(const std::optional<at::Tensor>& t) { return t.has_value() && needs_grad(*t); }
template <class T>
bool needs_grad(const T&) { return false; }

// What the placeholder gradient of argument `i` needs (its sizes and dtype), saved when the argument requires grad.
void save_grad_meta(torch::autograd::AutogradContext* ctx, size_t i, const at::Tensor& t) {
  if (!needs_grad(t)) return;
  ctx->saved_data["shape" + std::to_string(i)] = c10::IValue(t.sym_sizes().vec());
  ctx->saved_data["dtype" + std::to_string(i)] = static_cast<int64_t>(t.scalar_type());
}
void save_grad_meta(torch::autograd::AutogradContext* ctx, size_t i, const std::optional<at::Tensor>& t) {
  if (t.has_value()) save_grad_meta(ctx, i, *t);
}
template <class T>
void save_grad_meta(torch::autograd::AutogradContext*, size_t, const T&) {}

// The gradient of an input: `oasr::no_backward` (families/autograd.py), which raises naming the op when a backward
// really runs and is a shaped placeholder while AOTAutograd traces one (a graph compiled with grad on).
at::Tensor no_backward_grad(const at::Tensor& grad, const char* op, const c10::IValue& shape, int64_t dtype) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("oasr::no_backward", "")
                                 .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::SymIntArrayRef,
                                                   at::ScalarType)>();
  auto sizes = shape.toSymIntVector();
  return handle.call(grad, std::string("oasr.") + op, sizes, static_cast<at::ScalarType>(dtype));
}

// An op's outputs as the list an autograd Function returns, and back (one tensor, or layer_norm_quant's three).
torch::autograd::variable_list as_list(at::Tensor t) { return {std::move(t)}; }
torch::autograd::variable_list as_list(Tensor3 t) {
  return {std::move(std::get<0>(t)), std::move(std::get<1>(t)), std::move(std::get<2>(t))};
}
template <class R>
R from_list(torch::autograd::variable_list v);
template <>
at::Tensor from_list<at::Tensor>(torch::autograd::variable_list v) { return std::move(v[0]); }
template <>
Tensor3 from_list<Tensor3>(torch::autograd::variable_list v) {
  return Tensor3(std::move(v[0]), std::move(v[1]), std::move(v[2]));
}

// The backend and Autograd kernels of one op, from its hit path (whose argument list is the op's schema, and whose
// result, when it has one, the op's).
template <Op kOp, auto Hit, class Sig>
struct Served;

template <Op kOp, auto Hit, class R, class... Args>
struct Served<kOp, Hit, std::optional<R>(Args...)> {
  using Sig = R(Args...);

  static const c10::TypedOperatorHandle<Sig>& op() {
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow((std::string("oasr::") + kOpNames[kOp]).c_str(), "")
                                   .template typed<Sig>();
    return handle;
  }
  // The Python implementation, registered under this name at the backend key while the hot path is on.
  static const c10::TypedOperatorHandle<Sig>& python() {
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow((std::string("oasr::_") + kOpNames[kOp] + "_py").c_str(), "")
                                   .template typed<Sig>();
    return handle;
  }

  // The backend kernel: the hit path, else the Python implementation at the same key.
  static R backend(Args... args) {
    if (auto out = Hit(args...)) return *std::move(out);
    return python().redispatch(c10::DispatchKeySet(backend_key), args...);
  }

  struct NoBackward : public torch::autograd::Function<NoBackward> {
    static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, Args... args) {
      size_t i = 0;
      (save_grad_meta(ctx, i++, args), ...);
      at::AutoDispatchBelowADInplaceOrView guard;
      return as_list(op().call(args...));
    }
    // Not a TORCH_CHECK: AOTAutograd traces this backward when a graph holding the op is compiled with grad on.
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
      at::Tensor g;
      for (auto& x : grads) {
        if (x.defined()) {
          g = x;
          break;
        }
      }
      torch::autograd::variable_list out(sizeof...(Args));
      for (size_t i = 0; i < out.size() && g.defined(); ++i) {
        auto shape = ctx->saved_data.find("shape" + std::to_string(i));
        if (shape == ctx->saved_data.end()) continue;
        out[i] = no_backward_grad(g, kOpNames[kOp], shape->second,
                                  ctx->saved_data["dtype" + std::to_string(i)].toInt());
      }
      return out;
    }
  };

  static R autograd(c10::DispatchKeySet keys, Args... args) {
    if (c10::GradMode::is_enabled() && (needs_grad(args) || ...)) return from_list<R>(NoBackward::apply(args...));
    // Below here nothing is recorded for autograd, so the aten calls a hit path makes (the torch arm's addmm, an
    // empty) skip their Autograd and ADInplaceOrView kernels too: a TLS flag instead of two dispatch hops each.
    at::AutoDispatchBelowADInplaceOrView guard;
    if ((keys & c10::after_ADInplaceOrView_keyset) == c10::DispatchKeySet(backend_key)) return backend(args...);
    return op().redispatch(keys & c10::after_autograd_keyset, args...);
  }

  static void register_in(torch::Library& backend_lib, torch::Library& autograd_lib) {
    backend_lib.impl(kOpNames[kOp], TORCH_FN(backend));
    autograd_lib.impl(kOpNames[kOp], TORCH_FN(autograd));
  }
};

template <Op kOp, auto Hit>
using ServedOp = Served<kOp, Hit, std::remove_pointer_t<decltype(Hit)>>;

void register_op(int64_t op, torch::Library& backend_lib, torch::Library& autograd_lib) {
  switch (op) {
    case kGemm: return ServedOp<kGemm, &gemm_hit>::register_in(backend_lib, autograd_lib);
    case kScaledMm: return ServedOp<kScaledMm, &scaled_mm_op_hit<kScaledMm>>::register_in(backend_lib, autograd_lib);
    case kScaledMmQuant:
      return ServedOp<kScaledMmQuant, &scaled_mm_quant_hit<kScaledMmQuant>>::register_in(backend_lib, autograd_lib);
    case kScaledMmActQuant:
      return ServedOp<kScaledMmActQuant, &scaled_mm_act_quant_hit<kScaledMmActQuant>>::register_in(backend_lib,
                                                                                                  autograd_lib);
    case kScaledMmResidual:
      return ServedOp<kScaledMmResidual, &scaled_mm_residual_hit<kScaledMmResidual>>::register_in(backend_lib,
                                                                                                  autograd_lib);
    case kConv1dDepthwise: return ServedOp<kConv1dDepthwise, &conv1d_hit>::register_in(backend_lib, autograd_lib);
    case kLayerNormQuant:
      return ServedOp<kLayerNormQuant, &layer_norm_quant_hit>::register_in(backend_lib, autograd_lib);
    case kScaledMmFp8:
      return ServedOp<kScaledMmFp8, &scaled_mm_op_hit<kScaledMmFp8>>::register_in(backend_lib, autograd_lib);
    case kScaledMmFp8Quant:
      return ServedOp<kScaledMmFp8Quant, &scaled_mm_quant_hit<kScaledMmFp8Quant>>::register_in(backend_lib,
                                                                                              autograd_lib);
    case kScaledMmFp8ActQuant:
      return ServedOp<kScaledMmFp8ActQuant, &scaled_mm_act_quant_hit<kScaledMmFp8ActQuant>>::register_in(
          backend_lib, autograd_lib);
    case kScaledMmFp8Residual:
      return ServedOp<kScaledMmFp8Residual, &scaled_mm_residual_hit<kScaledMmFp8Residual>>::register_in(
          backend_lib, autograd_lib);
    default: TORCH_CHECK(false, "oasr_hot: unknown op code ", op);
  }
}

// ---------------------------------------------------------------------------------- control ops (Python side)

int64_t abi_version() { return kAbiVersion; }

int64_t scalar_type_code(at::ScalarType dtype) { return static_cast<int64_t>(dtype); }

// Serve `ops` (codes) at `backend` (CUDA, or CPU for the CPU suite) and its Autograd key.
void enable(c10::string_view backend, std::vector<int64_t> ops) {
  TORCH_CHECK(backend == "CUDA" || backend == "CPU", "oasr_hot.enable: backend must be CUDA or CPU");
  TORCH_CHECK(libraries.empty(), "oasr_hot.enable: already enabled");
  for (int64_t op : ops) TORCH_CHECK(op >= 0 && op < kNumOps, "oasr_hot.enable: unknown op code ", op);
  const bool cuda = backend == "CUDA";
  backend_key = cuda ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  auto backend_lib =
      std::make_unique<torch::Library>(torch::Library::IMPL, "oasr", backend_key, __FILE__, __LINE__);
  auto autograd_lib = std::make_unique<torch::Library>(
      torch::Library::IMPL, "oasr", cuda ? c10::DispatchKey::AutogradCUDA : c10::DispatchKey::AutogradCPU, __FILE__,
      __LINE__);
  for (int64_t op : ops) register_op(op, *backend_lib, *autograd_lib);
  libraries.push_back(std::move(backend_lib));
  libraries.push_back(std::move(autograd_lib));
}

void disable() {
  while (!libraries.empty()) libraries.pop_back();  // autograd first: each destructor removes its registrations
}

// Params per op (hot_path.py): gemm (split, activation, workspace bytes); the scaled GEMMs (workspace bytes, vector
// alignment, expand scale_w); conv1d_depthwise (B, T, C, Kw, activation, glu); layer_norm_quant none.
void install(int64_t op, c10::string_view config, std::vector<int64_t> ints, int64_t arm, int64_t launcher,
             std::vector<int64_t> params, int64_t slot, c10::string_view config_id) {
  TORCH_CHECK(op >= 0 && op < kNumOps, "oasr_hot.install: unknown op code ", op);
  TORCH_CHECK(arm >= kTorch && arm <= kKernel, "oasr_hot.install: bad arm ", arm);
  TORCH_CHECK(arm == kKernel || op == kGemm, "oasr_hot.install: ", kOpNames[op], " has kernel plans only");
  TORCH_CHECK(arm != kKernel || launcher != 0, "oasr_hot.install: a kernel plan needs its launcher");
  TORCH_CHECK(ints.size() <= 24, "oasr_hot.install: too many key integers");
  const size_t n_params = op == kConv1dDepthwise ? 6 : op == kLayerNormQuant ? 0 : 3;
  TORCH_CHECK(params.size() == n_params, "oasr_hot.install: ", kOpNames[op], " takes ", n_params, " params, got ",
              params.size());
  auto in_int = [](int64_t v) { return v >= 0 && v <= INT32_MAX; };
  if (op == kConv1dDepthwise) {
    for (int64_t v : params) TORCH_CHECK(in_int(v), "oasr_hot.install: conv1d_depthwise param out of range");
  } else if (op == kLayerNormQuant) {  // key ints (x dtype, M, N, ..): the launcher takes M and N as int
    TORCH_CHECK(ints.size() == 9 && ints[1] > 0 && in_int(ints[1]) && ints[2] > 0 && in_int(ints[2]),
                "oasr_hot.install: layer_norm_quant key malformed or M, N out of range");
  } else {
    // key ints: gemm (dtype, act, M, N, K, ..), the scaled GEMMs (variant, M, N, K, ..)
    const size_t first_mnk = op == kGemm ? 2 : 1;
    TORCH_CHECK(ints.size() >= first_mnk + 3, "oasr_hot.install: key too short");
    for (size_t i = first_mnk; i < first_mnk + 3; ++i) {
      TORCH_CHECK(ints[i] > 0 && in_int(ints[i]), "oasr_hot.install: M, N, K out of range");
    }
    TORCH_CHECK(params[op == kGemm ? 2 : 0] >= 0, "oasr_hot.install: negative workspace size");
  }
  auto plan = std::make_shared<Plan>();
  plan->arm = static_cast<Arm>(arm);
  plan->launcher = reinterpret_cast<void*>(static_cast<uintptr_t>(launcher));
  plan->params.assign(params.begin(), params.end());
  plan->slot = slot;
  plan->config_id = std::string(config_id);
  PlanKey key{op, std::string(config), Ints(ints.begin(), ints.end())};
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  auto& entry = table[key];
  if (entry) return;  // installed already (two threads missed at once): keep the first, its slot counts
  slots.push_back(plan.get());
  entry = std::move(plan);
}

// (slot, calls) pairs, flattened, for every plan called since the last drain; the counts restart at zero.
std::vector<int64_t> drain_calls() {
  std::vector<int64_t> out;
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  for (Plan* plan : slots) {
    const int64_t n = plan->calls.exchange(0, std::memory_order_relaxed);
    if (n) {
      out.push_back(plan->slot);
      out.push_back(n);
    }
  }
  return out;
}

// Forget the plans (and the checked out_scales); returns how many plans there were.
int64_t clear() {
  {
    std::unique_lock<std::shared_mutex> lock(scale_mutex);
    scales_checked.clear();
  }
  std::unique_lock<std::shared_mutex> lock(table_mutex);
  const int64_t n = static_cast<int64_t>(table.size());
  slots.clear();
  table.clear();
  return n;
}

int64_t size() {
  std::shared_lock<std::shared_mutex> lock(table_mutex);
  return static_cast<int64_t>(table.size());
}

}  // namespace

TORCH_LIBRARY(oasr_hot, m) {
  m.def("abi_version() -> int", &abi_version);
  m.def("scalar_type_code(ScalarType dtype) -> int", &scalar_type_code);
  m.def("enable(str backend, int[] ops) -> ()", &enable);
  m.def("disable() -> ()", &disable);
  m.def("install(int op, str config, int[] ints, int arm, int launcher, int[] params, int slot, str config_id) -> ()",
        &install);
  m.def("out_scale_passed(Tensor out_scale) -> ()", &out_scale_passed);
  m.def("drain_calls() -> int[]", &drain_calls);
  m.def("clear() -> int", &clear);
  m.def("size() -> int", &size);
}
