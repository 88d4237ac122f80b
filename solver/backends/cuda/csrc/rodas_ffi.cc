// XLA FFI custom call launching the CUDA backend's Rodas5P ensemble kernel (issue 4, DESIGN §7).
//
// Built on first use by solver/cuda_ffi.py with
//     g++ -O2 -shared -fPIC -std=c++17 -isystem <jax.ffi.include_dir()> rodas_ffi.cc
//         -o rodas_ffi_<hash>.so -ldl
// No CUDA headers or libraries are needed at build time: the few driver entry points used are
// resolved from libcuda.so.1 with dlopen/dlsym on first use, with prototypes declared below.
//
// Flow
//   * Python compiles the numba-cuda-mlir kernel for a fixed signature, then hands its cubin and
//     mangled entry name to this library once through the C function `rodas_ffi_register_kernel`
//     (ctypes), under an integer key.  The key is the FFI attribute `kernel_key`; the image itself
//     never travels through the HLO.
//   * On execution the handler finds the CUDA context of XLA's stream (cuStreamGetCtx), loads the
//     cubin into that context with cuModuleLoadData the first time (one module per key and
//     context, kept for the life of the process), and launches ceil(N*lanes/tpb) blocks of tpb
//     threads on XLA's stream with cuLaunchKernel (lanes = the attribute `lanes_per_traj`: 1
//     for the thread kernel, the warp width for the warp kernel).  No synchronisation: XLA orders the
//     outputs' consumers.
//
// Kernel-argument layout (what numba-cuda-mlir's own launcher does; see cuda_ffi.py's docstring):
// the kernel is an MLIR gpu.func lowered with the default memref calling convention, so every
// array argument of rank r is passed as 3 + 2r separate parameters
//     allocated_ptr, aligned_ptr, offset (i64, elements), sizes[r] (i64),
//     strides[r] (i64, elements)
// and scalars as themselves (f64 or i64).  XLA buffers handed to FFI custom calls are dense
// row-major (ffi_call's default layouts), so offset = 0 and strides are the row-major element
// strides of the buffer's dimensions.
//
// The order of the kernel's parameters is the attribute `layout`: pairs (code, index) with
//     0 = input buffer  #index            (array; expanded as above)
//     1 = output buffer #index            (array; expanded as above)
//     2 = f64 scalar    f64_scalars[index]
//     3 = i64 scalar    leading dimension of input buffer #index (the number of trajectories)
//     4 = i64 scalar    i64_scalars[index]
// The grid size comes from the leading dimension of input buffer #traj_arg.
// If the driver has cuFuncGetParamInfo (CUDA >= 12.4) the kernel's real parameter count and sizes
// are checked against the layout before the first launch of every shape (a clear error instead of
// a crash if numba-cuda-mlir's argument lowering ever differs).

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// ------------------------------------------------------------------ CUDA driver API, no headers
typedef int CUresult;  // CUDA_SUCCESS == 0
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;

constexpr int kAbiVersion = 2;

struct Driver {
  bool loaded = false;
  std::string error;
  CUresult (*cuInit)(unsigned int) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext*) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void**,
                             void**) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  // optional (CUDA >= 12.4): parameter offsets and sizes of a kernel
  CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*) = nullptr;
};

std::mutex g_mutex;  // guards g_driver loading, g_kernels
Driver g_driver;
std::atomic<long long> g_launches{0};

template <typename F>
bool Resolve(void* lib, F& fn, std::initializer_list<const char*> names, std::string& missing) {
  for (const char* name : names) {
    void* sym = dlsym(lib, name);
    if (sym != nullptr) {
      fn = reinterpret_cast<F>(sym);
      return true;
    }
  }
  if (!missing.empty()) missing += ", ";
  missing += *names.begin();
  return false;
}

// Called with g_mutex held.
const Driver& LoadDriver() {
  if (g_driver.loaded || !g_driver.error.empty()) return g_driver;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    g_driver.error = std::string("dlopen(libcuda.so.1) failed: ") + (why ? why : "unknown");
    return g_driver;
  }
  Driver& d = g_driver;
  std::string missing;
  bool ok = true;
  ok &= Resolve(lib, d.cuInit, {"cuInit"}, missing);
  ok &= Resolve(lib, d.cuCtxGetCurrent, {"cuCtxGetCurrent"}, missing);
  ok &= Resolve(lib, d.cuCtxPushCurrent, {"cuCtxPushCurrent_v2", "cuCtxPushCurrent"}, missing);
  ok &= Resolve(lib, d.cuCtxPopCurrent, {"cuCtxPopCurrent_v2", "cuCtxPopCurrent"}, missing);
  ok &= Resolve(lib, d.cuModuleLoadData, {"cuModuleLoadData"}, missing);
  ok &= Resolve(lib, d.cuModuleGetFunction, {"cuModuleGetFunction"}, missing);
  ok &= Resolve(lib, d.cuLaunchKernel, {"cuLaunchKernel"}, missing);
  // optional: without them the current context is used, errors are numbers, nothing is checked
  std::string optional_missing;
  // the unversioned symbol keeps the (CUstream, CUcontext*) signature; _v2 differs (green ctx)
  Resolve(lib, d.cuStreamGetCtx, {"cuStreamGetCtx"}, optional_missing);
  Resolve(lib, d.cuGetErrorName, {"cuGetErrorName"}, optional_missing);
  Resolve(lib, d.cuGetErrorString, {"cuGetErrorString"}, optional_missing);
  Resolve(lib, d.cuFuncGetParamInfo, {"cuFuncGetParamInfo"}, optional_missing);
  if (!ok) {
    d.error = "libcuda.so.1 lacks: " + missing;
    return d;
  }
  CUresult rc = d.cuInit(0);
  if (rc != 0) {
    d.error = "cuInit failed with CUresult " + std::to_string(rc);
    return d;
  }
  d.loaded = true;
  return d;
}

std::string CuErr(const Driver& d, CUresult rc) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(rc, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(rc, &text);
  std::ostringstream os;
  os << (name ? name : "CUDA_ERROR") << " (" << rc << ")";
  if (text) os << ": " << text;
  return os.str();
}

// ------------------------------------------------------------------ registered kernels
struct Loaded {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  std::vector<size_t> param_sizes;  // empty when cuFuncGetParamInfo is unavailable
  bool param_info = false;
};

struct Kernel {
  std::string image;      // cubin (or NUL-terminated PTX)
  std::string func_name;  // mangled entry name
  std::map<CUcontext, Loaded> per_context;
};

std::map<int64_t, Kernel> g_kernels;

// Called with g_mutex held.
ffi::ErrorOr<const Loaded*> GetFunction(const Driver& d, int64_t key, CUcontext ctx) {
  auto it = g_kernels.find(key);
  if (it == g_kernels.end()) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kInvalidArgument,
        "rodas_ffi: no kernel registered under key " + std::to_string(key) +
            " (solver.cuda_ffi registers it before tracing; was the library reloaded?)"));
  }
  Kernel& k = it->second;
  auto found = k.per_context.find(ctx);
  if (found != k.per_context.end()) return &found->second;

  CUcontext current = nullptr;
  d.cuCtxGetCurrent(&current);
  bool pushed = false;
  if (current != ctx) {
    CUresult rc = d.cuCtxPushCurrent(ctx);
    if (rc != 0) {
      return ffi::Unexpected<ffi::Error>(ffi::Error(ffi::ErrorCode::kInternal,
                                        "rodas_ffi: cuCtxPushCurrent failed: " + CuErr(d, rc)));
    }
    pushed = true;
  }
  Loaded loaded;
  std::string err;
  CUresult rc = d.cuModuleLoadData(&loaded.module, k.image.data());
  if (rc != 0) {
    err = "cuModuleLoadData failed: " + CuErr(d, rc);
  } else {
    rc = d.cuModuleGetFunction(&loaded.function, loaded.module, k.func_name.c_str());
    if (rc != 0) err = "cuModuleGetFunction('" + k.func_name + "') failed: " + CuErr(d, rc);
  }
  if (err.empty() && d.cuFuncGetParamInfo != nullptr) {
    // parameters until the first index the driver rejects; if it rejects index 0 the count is
    // unknown (a kernel without parameters, or no parameter info) and nothing is checked
    for (size_t i = 0; i < 65536; ++i) {
      size_t offset = 0, size = 0;
      if (d.cuFuncGetParamInfo(loaded.function, i, &offset, &size) != 0) break;
      loaded.param_sizes.push_back(size);
    }
    loaded.param_info = !loaded.param_sizes.empty();
  }
  if (pushed) {
    CUcontext popped = nullptr;
    d.cuCtxPopCurrent(&popped);
  }
  if (!err.empty()) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(ffi::ErrorCode::kInternal, "rodas_ffi: " + err));
  }
  auto inserted = k.per_context.emplace(ctx, std::move(loaded));
  return &inserted.first->second;
}

// One kernel parameter's value; every parameter the layout produces is 8 bytes wide.
union Slot {
  void* ptr;
  int64_t i64;
  double f64;
};

void PushArray(std::vector<Slot>& slots, void* data, ffi::Span<const int64_t> dims) {
  Slot s;
  s.ptr = data;
  slots.push_back(s);  // allocated pointer
  slots.push_back(s);  // aligned pointer
  s.i64 = 0;
  slots.push_back(s);  // offset (elements)
  const size_t r = dims.size();
  for (size_t i = 0; i < r; ++i) {
    s.i64 = dims[i];
    slots.push_back(s);  // sizes
  }
  std::vector<int64_t> strides(r, 1);
  for (size_t i = r; i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  for (size_t i = 0; i < r; ++i) {
    s.i64 = strides[i];
    slots.push_back(s);  // strides (elements, row-major)
  }
}

// Packs the kernel's parameters in the kernel's order (see the layout codes at the top) and
// finds the number of trajectories.
ffi::Error PackParams(const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
                      ffi::Span<const int64_t> layout, ffi::Span<const double> f64_scalars,
                      ffi::Span<const int64_t> i64_scalars, int64_t traj_arg,
                      std::vector<Slot>& slots, int64_t& n_traj) {
  if (layout.size() % 2 != 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "rodas_ffi: layout must hold pairs");
  }
  auto traj = args.get<ffi::AnyBuffer>(static_cast<size_t>(traj_arg));
  if (traj.has_error()) return traj.error();
  auto traj_dims = traj->dimensions();
  if (traj_dims.size() == 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "rodas_ffi: the trajectory buffer must have a leading dimension");
  }
  n_traj = traj_dims[0];
  slots.clear();
  slots.reserve(64);
  for (size_t p = 0; p < layout.size(); p += 2) {
    const int64_t code = layout[p];
    const int64_t idx = layout[p + 1];
    Slot s;
    switch (code) {
      case 0: {
        auto buf = args.get<ffi::AnyBuffer>(static_cast<size_t>(idx));
        if (buf.has_error()) return buf.error();
        PushArray(slots, buf->untyped_data(), buf->dimensions());
        break;
      }
      case 1: {
        auto buf = rets.get<ffi::AnyBuffer>(static_cast<size_t>(idx));
        if (buf.has_error()) return buf.error();
        PushArray(slots, (*buf)->untyped_data(), (*buf)->dimensions());
        break;
      }
      case 2:
        if (idx < 0 || static_cast<size_t>(idx) >= f64_scalars.size()) {
          return ffi::Error(ffi::ErrorCode::kInvalidArgument, "rodas_ffi: f64 index out of range");
        }
        s.f64 = f64_scalars[idx];
        slots.push_back(s);
        break;
      case 3: {
        auto buf = args.get<ffi::AnyBuffer>(static_cast<size_t>(idx));
        if (buf.has_error()) return buf.error();
        auto dims = buf->dimensions();
        s.i64 = dims.size() ? dims[0] : 1;
        slots.push_back(s);
        break;
      }
      case 4:
        if (idx < 0 || static_cast<size_t>(idx) >= i64_scalars.size()) {
          return ffi::Error(ffi::ErrorCode::kInvalidArgument, "rodas_ffi: i64 index out of range");
        }
        s.i64 = i64_scalars[idx];
        slots.push_back(s);
        break;
      default:
        return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                          "rodas_ffi: unknown layout code " + std::to_string(code));
    }
  }
  return ffi::Error::Success();
}

ffi::Error RodasSolveImpl(CUstream stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                          int64_t kernel_key, ffi::Span<const int64_t> layout,
                          ffi::Span<const double> f64_scalars, ffi::Span<const int64_t> i64_scalars,
                          int64_t traj_arg, int64_t threads_per_block,
                          int64_t lanes_per_traj) {
  if (threads_per_block <= 0 || threads_per_block > 1024) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "rodas_ffi: bad threads_per_block");
  }
  // threads per trajectory: 1 (thread kernel), 32 (warp kernel), directions x 1 or x 32 (the
  // sensitivity kernels); blocks = ceil(n_traj * lanes_per_traj / threads_per_block), so a
  // warp kernel's caller keeps a trajectory's lanes within whole blocks
  if (lanes_per_traj <= 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "rodas_ffi: lanes_per_traj must be positive");
  }
  std::vector<Slot> slots;
  int64_t n_traj = 0;
  ffi::Error packed =
      PackParams(args, rets, layout, f64_scalars, i64_scalars, traj_arg, slots, n_traj);
  if (packed.failure()) return packed;
  if (n_traj == 0) return ffi::Error::Success();

  // ---- driver, context, function
  std::lock_guard<std::mutex> lock(g_mutex);
  const Driver& d = LoadDriver();
  if (!d.loaded) {
    return ffi::Error(ffi::ErrorCode::kUnavailable, "rodas_ffi: CUDA driver: " + d.error);
  }
  CUcontext ctx = nullptr;
  CUresult rc = d.cuStreamGetCtx ? d.cuStreamGetCtx(stream, &ctx) : 1;
  if (rc != 0 || ctx == nullptr) {
    rc = d.cuCtxGetCurrent(&ctx);
    if (rc != 0 || ctx == nullptr) {
      return ffi::Error(ffi::ErrorCode::kInternal,
                        "rodas_ffi: no CUDA context for XLA's stream: " + CuErr(d, rc));
    }
  }
  auto loaded = GetFunction(d, kernel_key, ctx);
  if (loaded.has_error()) return loaded.error();
  const Loaded* fn = *loaded;
  if (fn->param_info) {
    bool same = fn->param_sizes.size() == slots.size();
    for (size_t i = 0; same && i < slots.size(); ++i) same = fn->param_sizes[i] == sizeof(Slot);
    if (!same) {
      std::ostringstream os;
      os << "rodas_ffi: the kernel's parameters do not match the argument layout: the cubin "
            "declares "
         << fn->param_sizes.size() << " parameters of sizes [";
      for (size_t i = 0; i < fn->param_sizes.size(); ++i) {
        os << (i ? "," : "") << fn->param_sizes[i];
      }
      os << "] bytes, the layout packs " << slots.size()
         << " parameters of 8 bytes (arrays as allocated, aligned, offset, sizes, strides). "
            "numba-cuda-mlir's kernel argument lowering changed: update solver/cuda_ffi.py and "
            "solver/csrc/rodas_ffi.cc";
      return ffi::Error(ffi::ErrorCode::kInternal, os.str());
    }
  }
  std::vector<void*> params(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) params[i] = &slots[i];

  CUcontext current = nullptr;
  d.cuCtxGetCurrent(&current);
  bool pushed = false;
  if (current != ctx) {
    rc = d.cuCtxPushCurrent(ctx);
    if (rc != 0) {
      return ffi::Error(ffi::ErrorCode::kInternal,
                        "rodas_ffi: cuCtxPushCurrent failed: " + CuErr(d, rc));
    }
    pushed = true;
  }
  const int64_t tpb = threads_per_block;
  const int64_t threads = n_traj * lanes_per_traj;
  const int64_t blocks = (threads + tpb - 1) / tpb;
  rc = d.cuLaunchKernel(fn->function, static_cast<unsigned int>(blocks), 1, 1,
                        static_cast<unsigned int>(tpb), 1, 1, 0, stream, params.data(), nullptr);
  if (pushed) {
    CUcontext popped = nullptr;
    d.cuCtxPopCurrent(&popped);
  }
  if (rc != 0) {
    return ffi::Error(ffi::ErrorCode::kInternal, "rodas_ffi: cuLaunchKernel(" +
                                                     std::to_string(blocks) + " x " +
                                                     std::to_string(tpb) + ") failed: " +
                                                     CuErr(d, rc));
  }
  g_launches.fetch_add(1);
  return ffi::Error::Success();
}


// CPU test aid (tests/test_cuda_ffi.py): the same decoding and packing as the CUDA handler, no
// launch.  The last result (int64, length L) receives [number of slots, slot bits..., -1 padding].
ffi::Error PackProbeImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t kernel_key,
                         ffi::Span<const int64_t> layout, ffi::Span<const double> f64_scalars,
                         ffi::Span<const int64_t> i64_scalars, int64_t traj_arg,
                         int64_t threads_per_block, int64_t lanes_per_traj) {
  (void)kernel_key;
  (void)threads_per_block;
  (void)lanes_per_traj;
  if (rets.size() == 0) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "probe: needs a dump result");
  }
  auto dump = rets.get<ffi::AnyBuffer>(rets.size() - 1);
  if (dump.has_error()) return dump.error();
  if ((*dump)->element_type() != ffi::DataType::S64) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "probe: dump must be int64");
  }
  std::vector<Slot> slots;
  int64_t n_traj = 0;
  ffi::Error packed =
      PackParams(args, rets, layout, f64_scalars, i64_scalars, traj_arg, slots, n_traj);
  if (packed.failure()) return packed;
  int64_t* out = static_cast<int64_t*>((*dump)->untyped_data());
  const size_t cap = (*dump)->element_count();
  for (size_t i = 0; i < cap; ++i) out[i] = -1;
  if (cap > 0) out[0] = static_cast<int64_t>(slots.size());
  for (size_t i = 0; i < slots.size() && i + 1 < cap; ++i) std::memcpy(&out[i + 1], &slots[i], 8);
  return ffi::Error::Success();
}

}  // namespace

// The FFI handler registered as the "CUDA" target by solver/cuda_ffi.py.
XLA_FFI_DEFINE_HANDLER_SYMBOL(BoltzmannRodasSolve, RodasSolveImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("kernel_key")
                                  .Attr<ffi::Span<const int64_t>>("layout")
                                  .Attr<ffi::Span<const double>>("f64_scalars")
                                  .Attr<ffi::Span<const int64_t>>("i64_scalars")
                                  .Attr<int64_t>("traj_arg")
                                  .Attr<int64_t>("threads_per_block")
                                  .Attr<int64_t>("lanes_per_traj"));

// The same decoding and packing on the host platform, for tests without a GPU.
XLA_FFI_DEFINE_HANDLER_SYMBOL(BoltzmannRodasPackProbe, PackProbeImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("kernel_key")
                                  .Attr<ffi::Span<const int64_t>>("layout")
                                  .Attr<ffi::Span<const double>>("f64_scalars")
                                  .Attr<ffi::Span<const int64_t>>("i64_scalars")
                                  .Attr<int64_t>("traj_arg")
                                  .Attr<int64_t>("threads_per_block")
                                  .Attr<int64_t>("lanes_per_traj"));

extern "C" {

// Version of this C interface; solver/cuda_ffi.py refuses a library with another one.
int rodas_ffi_abi_version() { return kAbiVersion; }

// Register (or replace) a kernel image under `key`.  The bytes are copied.  Returns 0.
int rodas_ffi_register_kernel(int64_t key, const char* image, size_t size, const char* func_name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Kernel k;
  k.image.assign(image, size);
  k.func_name = func_name;
  auto it = g_kernels.find(key);
  if (it != g_kernels.end() && it->second.image == k.image && it->second.func_name == k.func_name) {
    return 0;  // same kernel: keep the modules already loaded
  }
  g_kernels[key] = std::move(k);  // modules of a replaced image are leaked (never unloaded)
  return 0;
}

// Number of successful kernel launches through the handler in this process (tests: one launch per
// vmapped solve).
long long rodas_ffi_launch_count() { return g_launches.load(); }

// Empty string when libcuda and every required entry point load; else the reason.
const char* rodas_ffi_driver_status() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Driver& d = LoadDriver();
  return d.loaded ? "" : d.error.c_str();
}

}  // extern "C"
