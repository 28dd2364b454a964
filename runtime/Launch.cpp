//===- Launch.cpp - the calls compiled GPU layers make --------------------===//

#include "runtime/moert.h"

#include "codegen/nvidia/support/Sm90a.h"
#include "runtime/CudaDriver.h"
#include "runtime/DriverApi.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

using namespace moe::rt;

namespace {
// Values from cuda.h.
constexpr int kMaxDynamicSharedBytes = 8, kSharedCarveout = 9,
              kProgrammaticStreamSerialization = 6;
constexpr int kCooperative = 2;
constexpr int kTensorMapBFloat16 = 9, kTensorMapFloat32 = 7,
              kTensorMapUInt8 = 0;
constexpr int kSwizzle64B = 2, kSwizzle128B = 3, kL2Promotion128B = 2;

thread_local std::string lastError;

int32_t fail(const std::string &message) {
  lastError = message;
  return 1;
}

/// A loaded module and the functions looked up in it, by the address of
/// their name: a compiled layer passes its own constant strings, and each
/// layer has its own cache.
struct Module {
  void *handle = nullptr;
  std::unordered_map<const char *, void *> functions;
};
/// An image's modules, one per context it ran in.
struct ModuleCache {
  std::unordered_map<void *, Module> byContext;
};
std::mutex mutex;

struct Timing {
  std::string kernel;
  void *start, *end;
};
std::vector<Timing> timings;

/// The driver and the current context (device 0's primary one, made
/// current, if the caller made none current).
CudaDevice::Driver *driverWithContext(void *&context, std::string &error) {
  static std::unique_ptr<CudaDevice> fallback;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  if (!driver)
    return nullptr;
  if (driver->cuCtxGetCurrent(&context) == 0 && context)
    return driver;
  // Contexts are per thread: make the fallback current on this one.
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!fallback ? !(fallback = CudaDevice::open(0, error))
                  : !fallback->makeCurrent(error))
      return nullptr;
  }
  return CudaDevice::checkResult(driver, driver->cuCtxGetCurrent(&context),
                                 "cuCtxGetCurrent", error)
             ? driver
             : nullptr;
}
} // namespace

#define CHECK(call, name)                                                      \
  do {                                                                         \
    if (!CudaDevice::checkResult(driver, call, name, error))                   \
      return fail(error);                                                      \
  } while (false)

extern "C" int32_t moert_launch(void **module, const void *image,
                                const char *kernel, uint32_t gridX,
                                uint32_t gridY, uint32_t blockX,
                                uint32_t sharedBytes, uint32_t flags,
                                void *stream, void **params) {
  std::string error;
  void *context = nullptr;
  CudaDevice::Driver *driver = driverWithContext(context, error);
  if (!driver)
    return fail(error);
  void *function = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!*module)
      *module = new ModuleCache();
    Module *loaded = &static_cast<ModuleCache *>(*module)->byContext[context];
    if (!loaded->handle)
      CHECK(driver->cuModuleLoadData(&loaded->handle, image),
            "cuModuleLoadData");
    void *&slot = loaded->functions[kernel];
    if (!slot) {
      void *found = nullptr;
      CHECK(driver->cuModuleGetFunction(&found, loaded->handle, kernel),
            "cuModuleGetFunction");
      // Beyond what a kernel gets without opting in, dynamic shared memory
      // must be asked for; and all of it preferred over L1, or the driver
      // may split a multiprocessor's memory for fewer blocks than its
      // registers and shared memory allow (the decode tile's two).
      if (sharedBytes > ::sm90a::kSharedWithoutOptIn) {
        CHECK(driver->cuFuncSetAttribute(found, kMaxDynamicSharedBytes,
                                         int(sharedBytes)),
              "cuFuncSetAttribute");
        CHECK(driver->cuFuncSetAttribute(found, kSharedCarveout, 100),
              "cuFuncSetAttribute");
      }
      slot = found; // Cached only once ready to launch.
    }
    function = slot;
  }
  if (gridX == 0 || gridY == 0)
    return 0;
  // With MOERT_KERNEL_TIMES set, every launch is bracketed by events, for
  // moert_kernel_times_report.
  static const bool timed = std::getenv("MOERT_KERNEL_TIMES") != nullptr;
  void *events[2] = {nullptr, nullptr};
  if (timed && driver->cuEventCreate(&events[0], 0) == 0 &&
      driver->cuEventCreate(&events[1], 0) == 0)
    driver->cuEventRecord(events[0], stream);
  // Programmatic dependent launch: the grid launches as the stream's
  // previous kernel's blocks exit, not after it has drained (every kernel
  // waits for it with griddepcontrol.wait before its first memory access),
  // so the launch hides behind that kernel's tail. MOERT_NO_PDL=1 launches
  // plainly, for comparison.
  static const bool plain = std::getenv("MOERT_NO_PDL") != nullptr;
  int result;
  if (plain && !(flags & 1)) {
    result = driver->cuLaunchKernel(function, gridX, gridY, 1, blockX, 1, 1,
                                    sharedBytes, stream, params, nullptr);
  } else {
    // A cooperative grid (its blocks wait for each other at grid barriers)
    // is launched whole, or refused if its blocks cannot all be resident:
    // never left spinning for blocks that wait for a free multiprocessor.
    CudaDevice::Driver::LaunchAttribute overlap = {};
    overlap.id = (flags & 1) ? kCooperative : kProgrammaticStreamSerialization;
    int allowed = 1;
    std::memcpy(overlap.value, &allowed, sizeof(allowed));
    CudaDevice::Driver::LaunchConfig config = {
        {gridX, gridY, 1}, {blockX, 1, 1}, sharedBytes, stream, &overlap, 1};
    result = driver->cuLaunchKernelEx(&config, function, params, nullptr);
  }
  if (timed && events[1]) {
    driver->cuEventRecord(events[1], stream);
    std::lock_guard<std::mutex> lock(mutex);
    timings.push_back({kernel, events[0], events[1]});
  }
  if (result != 0) {
    std::string call = std::string("cuLaunchKernel(") + kernel + ")";
    CHECK(result, call.c_str());
  }
  return 0;
}

extern "C" int32_t moert_multiprocessors(void) {
  // Per device ordinal, found once.
  static std::atomic<int32_t> known[64];
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  int device = 0, count = 0;
  if (!driver || driver->cuCtxGetDevice(&device) != 0 || device < 0 ||
      device >= 64)
    return 1;
  if (int32_t n = known[device].load(std::memory_order_relaxed))
    return n;
  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  if (driver->cuDeviceGetAttribute(&count, 16, device) != 0 || count < 1)
    return 1;
  known[device].store(count, std::memory_order_relaxed);
  return count;
}

extern "C" int32_t moert_tensor_map(void *descriptor, void *base,
                                    int32_t elementBytes, int32_t rank,
                                    const int64_t *dims, const int64_t *strides,
                                    const int64_t *box) {
  if (rank < 2 || rank > 5)
    return fail("a TMA descriptor has 2 to 5 dimensions, not " +
                std::to_string(rank));
  bool empty = !base;
  for (int32_t i = 0; i < rank; ++i)
    empty |= dims[i] == 0;
  if (empty) {
    std::memset(descriptor, 0, 128);
    return 0;
  }
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  if (!driver)
    return fail(error);
  uint64_t globalDims[5], globalStrides[4];
  unsigned boxDims[5], elementStrides[5];
  for (int32_t i = 0; i < rank; ++i) {
    globalDims[i] = uint64_t(dims[i]);
    boxDims[i] = unsigned(box[i]);
    elementStrides[i] = 1;
    if (i > 0)
      globalStrides[i - 1] = uint64_t(strides[i - 1]) * uint64_t(elementBytes);
  }
  CHECK(driver->cuTensorMapEncodeTiled(
            descriptor,
            elementBytes == 4   ? kTensorMapFloat32
            : elementBytes == 2 ? kTensorMapBFloat16
                                : kTensorMapUInt8,
            rank, base, globalDims, globalStrides, boxDims, elementStrides,
            /*interleave=*/0,
            // A box's rows are one swizzle span: 128 bytes, or 64 (MXFP8
            // codes converted in shared memory).
            box[0] * elementBytes == 64 ? kSwizzle64B : kSwizzle128B,
            kL2Promotion128B, /*oobFill=*/0),
        "cuTensorMapEncodeTiled");
  return 0;
}

extern "C" int32_t moert_check_call(void *const *args, const char *kinds,
                                    int64_t tokens, int64_t maxTokens,
                                    const void *workspace,
                                    int64_t workspaceBytes) {
  if (tokens < 0 || tokens > maxTokens)
    return fail("the token count " + std::to_string(tokens) +
                " is outside the layer's range [0, " +
                std::to_string(maxTokens) + "]");
  size_t count = std::strlen(kinds);
  if (!args && count > 0)
    return fail("args is null");
  auto misaligned = [](const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 != 0;
  };
  for (size_t i = 0; i < count; ++i) {
    // 'e': an empty tensor, never read.
    bool read = kinds[i] == 'w' || (kinds[i] == 't' && tokens > 0);
    if (read && !args[i])
      return fail("argument " + std::to_string(i) + " is null");
    if (misaligned(args[i]))
      return fail("argument " + std::to_string(i) +
                  " is not 16-byte aligned; the kernels read and write 16 "
                  "bytes at a time");
  }
  if (workspaceBytes > 0 && (!workspace || misaligned(workspace)))
    return fail("the workspace (" + std::to_string(workspaceBytes) +
                " bytes for " + std::to_string(tokens) +
                " tokens) is null or not 16-byte aligned");
  return 0;
}

extern "C" const char *moert_last_error(void) { return lastError.c_str(); }

extern "C" void moert_set_error(const char *message) { lastError = message; }

extern "C" void moert_kernel_times_report(const char *label) {
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  std::lock_guard<std::mutex> lock(mutex);
  if (!driver || timings.empty())
    return;
  // Kernel name -> (launches, total ms), in first-launch order.
  std::vector<std::pair<std::string, std::pair<int, double>>> totals;
  for (const Timing &t : timings) {
    float ms = 0;
    driver->cuEventSynchronize(t.end);
    driver->cuEventElapsedTime(&ms, t.start, t.end);
    auto it = std::find_if(totals.begin(), totals.end(),
                           [&](const auto &e) { return e.first == t.kernel; });
    if (it == totals.end())
      totals.push_back({t.kernel, {1, ms}});
    else
      it->second.first++, it->second.second += ms;
  }
  for (const auto &[kernel, total] : totals)
    std::fprintf(stderr, "%s kernel %s: %d launches, %.2f us each\n", label,
                 kernel.c_str(), total.first,
                 1000.0 * total.second / total.first);
  timings.clear();
}

extern "C" int32_t moert_set_tokens(void *workspace, int64_t tokens,
                                    int64_t words, void *stream) {
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  if (!driver)
    return fail(error);
  CHECK(driver->cuMemsetD32Async(reinterpret_cast<uintptr_t>(workspace),
                                 unsigned(tokens), size_t(words), stream),
        "cuMemsetD32Async");
  return 0;
}

namespace {
/// One captured graph of a bucket and what it was captured for (a graph
/// launches on any stream of its context).
struct Graph {
  void *context, *workspace;
  std::vector<void *> args;
  void *exec;
  uint64_t used;
};
/// A bucket's graphs: a few argument sets, the least recently used one
/// updated in place when another comes.
struct Graphs {
  std::mutex mutex;
  std::vector<Graph> graphs;
  uint64_t clock = 0;
};
constexpr size_t kGraphsPerBucket = 4;
// Values from cuda.h.
constexpr int kCaptureStatusNone = 0, kCaptureModeRelaxed = 2;
constexpr unsigned kStreamNonBlocking = 1;
/// Per context, the stream graphs are captured on (under captureMutex).
std::unordered_map<void *, void *> captureStreams;
std::mutex captureMutex;

bool graphsOff() {
  static const bool off = [] {
    const char *graphs = std::getenv("MOE_GRAPHS");
    return (graphs && std::string(graphs) == "0") ||
           std::getenv("MOERT_KERNEL_TIMES") != nullptr;
  }();
  return off;
}

/// The bucket's graph for this call, captured (or updated) if new.
int32_t graphFor(void **slot, moert_enqueue_fn enqueue, void *const *args,
                 int32_t numArgs, int64_t bucketTokens, void *workspace,
                 void *&exec) {
  std::string error;
  void *context = nullptr;
  CudaDevice::Driver *driver = driverWithContext(context, error);
  if (!driver)
    return fail(error);
  Graphs *cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!*slot)
      *slot = new Graphs();
    cache = static_cast<Graphs *>(*slot);
  }
  std::lock_guard<std::mutex> lock(cache->mutex);
  // A replay compares pointers in place; only a capture copies them.
  for (Graph &g : cache->graphs)
    if (g.context == context && g.workspace == workspace &&
        std::equal(g.args.begin(), g.args.end(), args, args + numArgs)) {
      g.used = ++cache->clock;
      exec = g.exec;
      return 0;
    }
  // Captured on a stream of the runtime's own (the caller's may be the
  // legacy default stream, which cannot be captured). Relaxed: the first
  // launch of a kernel loads the module, which a stricter mode refuses.
  // One capture at a time per process: they share the stream.
  std::lock_guard<std::mutex> capturing(captureMutex);
  void *&captureStream = captureStreams[context];
  if (!captureStream)
    CHECK(driver->cuStreamCreate(&captureStream, kStreamNonBlocking),
          "cuStreamCreate");
  CHECK(driver->cuStreamBeginCapture(captureStream, kCaptureModeRelaxed),
        "cuStreamBeginCapture");
  int32_t status = enqueue(args, bucketTokens, captureStream, workspace);
  void *graph = nullptr;
  int ended = driver->cuStreamEndCapture(captureStream, &graph);
  if (status != 0) {
    if (graph)
      driver->cuGraphDestroy(graph);
    return status;
  }
  CHECK(ended, "cuStreamEndCapture");
  // The least recently used graph of this stream and context takes the
  // new arguments when the bucket has its fill: same kernels, new
  // parameters.
  Graph *victim = nullptr;
  if (cache->graphs.size() >= kGraphsPerBucket)
    for (Graph &g : cache->graphs)
      if (!victim || g.used < victim->used)
        victim = &g;
  int result = 1;
  if (victim && victim->context == context) {
    CudaDevice::Driver::GraphExecUpdateResultInfo info{};
    result = driver->cuGraphExecUpdate(victim->exec, graph, &info);
  }
  if (result != 0) {
    void *fresh = nullptr;
    result = driver->cuGraphInstantiateWithFlags(&fresh, graph, 0);
    if (result != 0) {
      driver->cuGraphDestroy(graph);
      CHECK(result, "cuGraphInstantiateWithFlags");
    }
    if (victim) {
      driver->cuGraphExecDestroy(victim->exec);
      victim->exec = fresh;
    } else {
      cache->graphs.push_back({});
      victim = &cache->graphs.back();
      victim->exec = fresh;
    }
  }
  driver->cuGraphDestroy(graph);
  victim->context = context;
  victim->workspace = workspace;
  victim->args.assign(args, args + numArgs);
  victim->used = ++cache->clock;
  exec = victim->exec;
  return 0;
}

/// Whether the caller is capturing `stream` (then its graph takes the
/// launches themselves).
bool capturing(CudaDevice::Driver *driver, void *stream) {
  int status = 0;
  return driver->cuStreamIsCapturing(stream, &status) != 0 ||
         status != kCaptureStatusNone;
}
} // namespace

extern "C" int32_t moert_graph_launch(void **graphs, moert_enqueue_fn enqueue,
                                      void *const *args, int32_t numArgs,
                                      int64_t tokens, int64_t bucketTokens,
                                      void *stream, void *workspace,
                                      int32_t enabled) {
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  if (!driver)
    return fail(error);
  if (!enabled || graphsOff() || capturing(driver, stream))
    return enqueue(args, tokens, stream, workspace);
  void *exec = nullptr;
  if (int32_t status = graphFor(graphs, enqueue, args, numArgs, bucketTokens,
                                workspace, exec))
    return status;
  CHECK(driver->cuGraphLaunch(exec, stream), "cuGraphLaunch");
  return 0;
}

extern "C" int32_t moert_graph_prepare(void **graphs, moert_enqueue_fn enqueue,
                                       void *const *args, int32_t numArgs,
                                       int64_t bucketTokens, void *stream,
                                       void *workspace) {
  std::string error;
  CudaDevice::Driver *driver = CudaDevice::loadDriver(error);
  if (!driver)
    return fail(error);
  if (capturing(driver, stream))
    return fail("warmup cannot run while the stream is being captured");
  void *exec = nullptr;
  return graphFor(graphs, enqueue, args, numArgs, bucketTokens, workspace,
                  exec);
}
