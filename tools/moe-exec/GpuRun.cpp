//===- GpuRun.cpp - running a GPU layer -----------------------------------===//

#include "tools/moe-exec/GpuRun.h"
#include "tools/moe-exec/LayerLibrary.h"

#include "runtime/CudaDriver.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>

using namespace moe::exec;
using moe::rt::CudaDevice;

namespace {

using DevicePtr = CudaDevice::DevicePtr;

/// Device memory, freed when it goes out of scope.
class DeviceBuffers {
public:
  explicit DeviceBuffers(CudaDevice &cuda) : cuda(cuda) {}
  DeviceBuffers(const DeviceBuffers &) = delete;
  DeviceBuffers &operator=(const DeviceBuffers &) = delete;
  ~DeviceBuffers() {
    for (DevicePtr p : buffers)
      cuda.free(p);
  }

  /// At least one byte, so that empty tensors have an address too. 0 with
  /// `error` set on failure.
  DevicePtr allocate(size_t bytes, std::string &error) {
    DevicePtr p = cuda.allocate(bytes ? bytes : 1, error);
    if (p)
      buffers.push_back(p);
    return p;
  }

private:
  CudaDevice &cuda;
  std::vector<DevicePtr> buffers;
};

/// Opens GPU `ordinal` (`label` in messages) and checks that it runs code
/// compiled for `target`; null with `error` set otherwise.
std::unique_ptr<CudaDevice> openGpu(int ordinal, const std::string &label,
                                    const std::string &target,
                                    std::string &error) {
  std::unique_ptr<CudaDevice> cuda = CudaDevice::open(ordinal, error);
  if (!cuda) {
    error = "cannot run " + target + " code: " + error;
    return nullptr;
  }
  if (target == "sm_90a" && cuda->computeCapability() != 90) {
    error = "the layer is compiled for sm_90a, but " + label + " (" +
            cuda->name() + ") is sm_" +
            std::to_string(cuda->computeCapability());
    return nullptr;
  }
  return cuda;
}

/// Fault injection for tests: this rank dies before its forward, and the
/// others must say so.
void killIfAsked(int rank) {
  if (const char *kill = std::getenv("MOE_EP_TEST_KILL_RANK"))
    if (std::atoi(kill) == rank)
      std::raise(SIGKILL);
}

/// The layer's arguments and workspace on the GPU.
struct DeviceArgs {
  std::vector<void *> pointers;
  void *workspace = nullptr;
};

/// The forward `runs` times, then the wait for the stream and, on an
/// expert-parallel rank, its status. Returns why it failed, or "".
std::string runForwards(CudaDevice &cuda, const LayerLibrary &layer,
                        const DeviceArgs &device, int64_t tokens, long runs,
                        bool group) {
  const LayerEntries &entries = layer.entries;
  auto forward =
      reinterpret_cast<int32_t (*)(void *const *, int64_t, void *, void *)>(
          entries.forward);
  for (long run = 0; run < runs; ++run)
    if (forward(device.pointers.data(), tokens, nullptr, device.workspace) != 0)
      return layer.info.forward + " failed: " + entries.lastError();
  std::string error;
  if (!cuda.synchronize(error))
    return error;
  if (group && entries.status() != 0)
    return layer.info.forward + " failed: " + entries.lastError();
  return "";
}

/// Copies `args` to the GPU, runs the forward `repeat` times on the default
/// stream and copies the outputs back into `args`. `group`, for a rank of an
/// expert-parallel layer, is its init's config.
std::string runOnGpu(CudaDevice &cuda, const LayerLibrary &layer,
                     const std::vector<HostSpan> &args, int64_t tokens,
                     long repeat, const moe_ep_config_t *group,
                     double &microseconds) {
  const LayerEntries &entries = layer.entries;
  std::string error;
  DeviceBuffers buffers(cuda);
  DeviceArgs device;
  for (size_t i = 0; i < args.size(); ++i) {
    DevicePtr p = buffers.allocate(args[i].bytes, error);
    if (!p || (!layer.info.args[i].isOutput && args[i].bytes &&
               !cuda.copyToDevice(p, args[i].data, args[i].bytes, error)))
      return error;
    device.pointers.push_back(reinterpret_cast<void *>(p));
  }
  DevicePtr workspace =
      buffers.allocate(size_t(entries.workspaceSize(tokens)), error);
  if (!workspace)
    return error;
  device.workspace = reinterpret_cast<void *>(workspace);
  if (group) {
    if (entries.init(group) != 0)
      return std::string("init failed: ") + entries.lastError();
    killIfAsked(group->rank);
  }
  // A rank's first forward (module loads, first touches) is not timed.
  std::string why;
  if (group && repeat > 1)
    why = runForwards(cuda, layer, device, tokens, 1, true);
  auto start = std::chrono::steady_clock::now();
  if (why.empty())
    why = runForwards(cuda, layer, device, tokens, repeat, group);
  microseconds = std::chrono::duration<double, std::micro>(
                     std::chrono::steady_clock::now() - start)
                     .count() /
                 double(repeat);
  for (size_t i = 0; why.empty() && i < args.size(); ++i)
    if (layer.info.args[i].isOutput && args[i].bytes &&
        !cuda.copyToHost(args[i].data,
                         reinterpret_cast<DevicePtr>(device.pointers[i]),
                         args[i].bytes, error))
      why = error;
  if (group)
    entries.finalize();
  return why;
}

} // namespace

std::string moe::exec::runOnDevice0(LayerLibrary &layer, HostTensors &tensors,
                                    long repeat, double &microseconds) {
  std::string error;
  std::unique_ptr<CudaDevice> cuda =
      openGpu(0, "device 0", layer.info.target, error);
  if (!cuda || !findGpuEntries(layer, error))
    return error;
  return runOnGpu(*cuda, layer, wholeBuffers(tensors), tensors.tokens, repeat,
                  nullptr, microseconds);
}

std::string moe::exec::runRankOnGpu(const LayerLibrary &layer,
                                    const std::vector<HostSpan> &args,
                                    int64_t tokens, long repeat,
                                    const moe_ep_config_t &config,
                                    double &microseconds) {
  const std::string &target = layer.info.target;
  std::string error;
  int count = CudaDevice::count(error);
  if (count <= 0)
    return "cannot run " + target +
           " code: " + (count == 0 ? std::string("no GPU") : error);
  int ordinal = config.rank % count;
  std::unique_ptr<CudaDevice> cuda =
      openGpu(ordinal, "GPU " + std::to_string(ordinal), target, error);
  if (!cuda)
    return error;
  return runOnGpu(*cuda, layer, args, tokens, repeat, &config, microseconds);
}
