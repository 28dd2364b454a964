//===- CudaDriver.cpp - the CUDA driver, loaded at run time ---------------===//

#include "runtime/CudaDriver.h"
#include "runtime/DriverApi.h"

#include <dlfcn.h>
#include <type_traits>

using namespace moe::rt;

namespace {
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
} // namespace

CudaDevice::Driver *CudaDevice::loadDriver(std::string &error) {
  static CudaDevice::Driver driver;
  static std::string loadError;
  static bool loaded = [] {
    driver.library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver.library) {
      loadError =
          std::string("no CUDA driver on this machine (") + dlerror() + ")";
      return false;
    }
    bool ok = true;
    auto bind = [&](auto &slot, const char *name) {
      void *symbol = dlsym(driver.library, name);
      if (!symbol && ok) {
        loadError = std::string("the CUDA driver lacks ") + name;
        ok = false;
      }
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
    };
    bind(driver.cuInit, "cuInit");
    bind(driver.cuDeviceGetCount, "cuDeviceGetCount");
    bind(driver.cuDeviceGet, "cuDeviceGet");
    bind(driver.cuDeviceGetName, "cuDeviceGetName");
    bind(driver.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    bind(driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    bind(driver.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    bind(driver.cuCtxSetCurrent, "cuCtxSetCurrent");
    bind(driver.cuCtxSynchronize, "cuCtxSynchronize");
    bind(driver.cuCtxGetDevice, "cuCtxGetDevice");
    bind(driver.cuModuleLoadData, "cuModuleLoadData");
    bind(driver.cuModuleGetFunction, "cuModuleGetFunction");
    bind(driver.cuLaunchKernel, "cuLaunchKernel");
    bind(driver.cuLaunchKernelEx, "cuLaunchKernelEx");
    bind(driver.cuMemAlloc, "cuMemAlloc_v2");
    bind(driver.cuMemFree, "cuMemFree_v2");
    bind(driver.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    bind(driver.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    bind(driver.cuGetErrorName, "cuGetErrorName");
    bind(driver.cuCtxGetCurrent, "cuCtxGetCurrent");
    bind(driver.cuFuncSetAttribute, "cuFuncSetAttribute");
    bind(driver.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
    bind(driver.cuStreamSynchronize, "cuStreamSynchronize");
    bind(driver.cuMemsetD8, "cuMemsetD8_v2");
    bind(driver.cuIpcGetMemHandle, "cuIpcGetMemHandle");
    bind(driver.cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    bind(driver.cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    bind(driver.cuMemHostAlloc, "cuMemHostAlloc");
    bind(driver.cuMemFreeHost, "cuMemFreeHost");
    bind(driver.cuEventCreate, "cuEventCreate");
    bind(driver.cuEventRecord, "cuEventRecord");
    bind(driver.cuEventSynchronize, "cuEventSynchronize");
    bind(driver.cuEventElapsedTime, "cuEventElapsedTime");
    bind(driver.cuMemsetD32Async, "cuMemsetD32Async");
    bind(driver.cuStreamCreate, "cuStreamCreate");
    bind(driver.cuStreamIsCapturing, "cuStreamIsCapturing");
    bind(driver.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    bind(driver.cuStreamEndCapture, "cuStreamEndCapture");
    bind(driver.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    bind(driver.cuGraphLaunch, "cuGraphLaunch");
    bind(driver.cuGraphExecUpdate, "cuGraphExecUpdate_v2");
    bind(driver.cuGraphDestroy, "cuGraphDestroy");
    bind(driver.cuGraphExecDestroy, "cuGraphExecDestroy");
    return ok;
  }();
  if (!loaded)
    error = loadError;
  return loaded ? &driver : nullptr;
}

bool CudaDevice::check(int result, const char *call, std::string &error) const {
  return checkResult(driver, result, call, error);
}

bool CudaDevice::checkResult(Driver *driver, int result, const char *call,
                             std::string &error) {
  if (result == 0)
    return true;
  const char *name = nullptr;
  // The stub library (no driver) fails cuGetErrorName too: say the number.
  if (driver->cuGetErrorName(result, &name) != 0 || !name)
    error = std::string(call) + " failed with CUDA error " +
            std::to_string(result) +
            (result == 34 ? " (CUDA_ERROR_STUB_LIBRARY: no real driver)" : "");
  else
    error = std::string(call) + " failed: " + name;
  return false;
}

int CudaDevice::count(std::string &error) {
  Driver *driver = loadDriver(error);
  int count = 0;
  if (!driver || !checkResult(driver, driver->cuInit(0), "cuInit", error) ||
      !checkResult(driver, driver->cuDeviceGetCount(&count), "cuDeviceGetCount",
                   error))
    return -1;
  return count;
}

std::unique_ptr<CudaDevice> CudaDevice::open(int ordinal, std::string &error) {
  Driver *driver = loadDriver(error);
  if (!driver)
    return nullptr;
  std::unique_ptr<CudaDevice> d(new CudaDevice());
  d->driver = driver;
  int count = 0;
  if (!d->check(driver->cuInit(0), "cuInit", error) ||
      !d->check(driver->cuDeviceGetCount(&count), "cuDeviceGetCount", error))
    return nullptr;
  if (ordinal < 0 || ordinal >= count) {
    error = "no CUDA device " + std::to_string(ordinal) + " (" +
            std::to_string(count) + " present)";
    return nullptr;
  }
  char name[256] = {};
  int major = 0, minor = 0;
  if (!d->check(driver->cuDeviceGet(&d->device, ordinal), "cuDeviceGet",
                error) ||
      !d->check(driver->cuDeviceGetName(name, sizeof(name) - 1, d->device),
                "cuDeviceGetName", error) ||
      !d->check(driver->cuDeviceGetAttribute(
                    &major, kAttrComputeCapabilityMajor, d->device),
                "cuDeviceGetAttribute", error) ||
      !d->check(driver->cuDeviceGetAttribute(
                    &minor, kAttrComputeCapabilityMinor, d->device),
                "cuDeviceGetAttribute", error) ||
      !d->check(driver->cuDevicePrimaryCtxRetain(&d->context, d->device),
                "cuDevicePrimaryCtxRetain", error))
    return nullptr;
  d->deviceName = name;
  d->capability = major * 10 + minor;
  if (!d->check(driver->cuCtxSetCurrent(d->context), "cuCtxSetCurrent", error))
    return nullptr;
  return d;
}

CudaDevice::~CudaDevice() {
  if (context)
    driver->cuDevicePrimaryCtxRelease(device);
}

void *CudaDevice::loadModule(const void *image, std::string &error) {
  void *module = nullptr;
  return check(driver->cuModuleLoadData(&module, image), "cuModuleLoadData",
               error)
             ? module
             : nullptr;
}

void *CudaDevice::getFunction(void *module, const char *name,
                              std::string &error) {
  void *function = nullptr;
  return check(driver->cuModuleGetFunction(&function, module, name),
               "cuModuleGetFunction", error)
             ? function
             : nullptr;
}

bool CudaDevice::launch(void *function, unsigned grid, unsigned block,
                        unsigned sharedBytes, void **args, std::string &error) {
  return check(driver->cuLaunchKernel(function, grid, 1, 1, block, 1, 1,
                                      sharedBytes, nullptr, args, nullptr),
               "cuLaunchKernel", error) &&
         check(driver->cuCtxSynchronize(), "cuCtxSynchronize", error);
}

CudaDevice::DevicePtr CudaDevice::allocate(size_t bytes, std::string &error) {
  DevicePtr pointer = 0;
  return check(driver->cuMemAlloc(&pointer, bytes), "cuMemAlloc", error)
             ? pointer
             : 0;
}

void CudaDevice::free(DevicePtr pointer) {
  if (pointer)
    driver->cuMemFree(pointer);
}

bool CudaDevice::copyToDevice(DevicePtr to, const void *from, size_t bytes,
                              std::string &error) {
  return check(driver->cuMemcpyHtoD(to, from, bytes), "cuMemcpyHtoD", error);
}

bool CudaDevice::copyToHost(void *to, DevicePtr from, size_t bytes,
                            std::string &error) {
  return check(driver->cuMemcpyDtoH(to, from, bytes), "cuMemcpyDtoH", error);
}

bool CudaDevice::synchronize(std::string &error) {
  return check(driver->cuCtxSynchronize(), "cuCtxSynchronize", error);
}

bool CudaDevice::makeCurrent(std::string &error) {
  return check(driver->cuCtxSetCurrent(context), "cuCtxSetCurrent", error);
}
