//===- CudaDriver.h - the CUDA driver, loaded at run time -------*- C++ -*-===//
//
// libcuda is opened with dlopen, never linked: a binary on a machine without
// a GPU or driver reports that plainly instead of failing to load. Every
// call is checked and its failure named ("cuModuleLoadData:
// CUDA_ERROR_INVALID_PTX"). No CUDA header is needed to build this.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_CUDADRIVER_H
#define MOE_RUNTIME_CUDADRIVER_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moe::rt {

/// One GPU's primary context, with the few driver calls the runtime uses.
class CudaDevice {
public:
  using DevicePtr = uint64_t;

  /// Loads the driver and makes `ordinal`'s primary context current; null
  /// with `error` saying why (no driver, no GPU, a failed call).
  static std::unique_ptr<CudaDevice> open(int ordinal, std::string &error);
  /// The GPUs present, or -1 with `error` saying why.
  static int count(std::string &error);
  ~CudaDevice();

  const std::string &name() const { return deviceName; }
  /// SM version, e.g. 90 for Hopper.
  int computeCapability() const { return capability; }

  /// Loads a module from a cubin, fatbin or PTX image; a handle or null.
  void *loadModule(const void *image, std::string &error);
  void *getFunction(void *module, const char *name, std::string &error);
  /// Launches on the default stream and waits for it.
  bool launch(void *function, unsigned grid, unsigned block,
              unsigned sharedBytes, void **args, std::string &error);
  DevicePtr allocate(size_t bytes, std::string &error);
  void free(DevicePtr pointer);
  bool copyToDevice(DevicePtr to, const void *from, size_t bytes,
                    std::string &error);
  bool copyToHost(void *to, DevicePtr from, size_t bytes, std::string &error);

  /// Makes this device's context current on the calling thread.
  bool makeCurrent(std::string &error);
  /// Waits for all work on the current context.
  bool synchronize(std::string &error);

  /// The driver's entry points (see CudaDriver.cpp), loaded once; null with
  /// `error` saying why.
  struct Driver;
  static Driver *loadDriver(std::string &error);
  /// True when `result` is success; else `error` names `call` and result.
  static bool checkResult(Driver *driver, int result, const char *call,
                          std::string &error);

private:
  CudaDevice() = default;
  bool check(int result, const char *call, std::string &error) const;

  Driver *driver = nullptr;
  void *context = nullptr;
  int device = 0;
  int capability = 0;
  std::string deviceName;
};

} // namespace moe::rt

#endif // MOE_RUNTIME_CUDADRIVER_H
