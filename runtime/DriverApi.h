//===- DriverApi.h - libcuda's entry points, as the runtime binds them ----===//
//
// Internal to libmoert: CudaDriver.cpp binds these with dlsym, Launch.cpp
// calls them for compiled layers.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_DRIVERAPI_H
#define MOE_RUNTIME_DRIVERAPI_H

#include "runtime/CudaDriver.h"

namespace moe::rt {

// The driver API's handles are opaque pointers and its device an int; these
// signatures follow cuda.h (the _v2 entry points where CUDA renamed them).
struct CudaDevice::Driver {
  void *library = nullptr;
  int (*cuInit)(unsigned);
  int (*cuDeviceGetCount)(int *);
  int (*cuDeviceGet)(int *, int);
  int (*cuDeviceGetName)(char *, int, int);
  int (*cuDeviceGetAttribute)(int *, int, int);
  int (*cuDevicePrimaryCtxRetain)(void **, int);
  int (*cuDevicePrimaryCtxRelease)(int);
  int (*cuCtxSetCurrent)(void *);
  int (*cuCtxSynchronize)();
  int (*cuModuleLoadData)(void **, const void *);
  int (*cuModuleGetFunction)(void **, void *, const char *);
  int (*cuLaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned,
                        unsigned, unsigned, unsigned, void *, void **, void **);
  // cuLaunchKernelEx's CUlaunchAttribute and CUlaunchConfig.
  struct LaunchAttribute {
    int id;
    char pad[4];
    alignas(8) char value[64];
  };
  struct LaunchConfig {
    unsigned grid[3], block[3], sharedBytes;
    void *stream;
    LaunchAttribute *attrs;
    unsigned numAttrs;
  };
  int (*cuLaunchKernelEx)(const LaunchConfig *, void *, void **, void **);
  int (*cuMemAlloc)(uint64_t *, size_t);
  int (*cuMemFree)(uint64_t);
  int (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
  int (*cuMemcpyDtoH)(void *, uint64_t, size_t);
  int (*cuGetErrorName)(int, const char **);
  // Used by compiled layers (Launch.cpp).
  int (*cuCtxGetCurrent)(void **);
  int (*cuCtxGetDevice)(int *);
  int (*cuFuncSetAttribute)(void *, int, int);
  int (*cuTensorMapEncodeTiled)(void *, int, unsigned, void *, const uint64_t *,
                                const uint64_t *, const unsigned *,
                                const unsigned *, int, int, int, int);
  int (*cuStreamSynchronize)(void *);
  // Expert parallelism on one host (EpCudaGroup.cpp).
  struct IpcHandle {
    char reserved[64];
  };
  int (*cuMemsetD8)(uint64_t, unsigned char, size_t);
  int (*cuIpcGetMemHandle)(IpcHandle *, uint64_t);
  int (*cuIpcOpenMemHandle)(uint64_t *, IpcHandle, unsigned);
  int (*cuIpcCloseMemHandle)(uint64_t);
  int (*cuMemHostAlloc)(void **, size_t, unsigned);
  int (*cuMemFreeHost)(void *);
  // Per-kernel timing (MOERT_KERNEL_TIMES).
  int (*cuEventCreate)(void **, unsigned);
  int (*cuEventRecord)(void *, void *);
  int (*cuEventSynchronize)(void *);
  int (*cuEventElapsedTime)(float *, void *, void *);
  // Token counts in device memory, and a CUDA graph per token bucket.
  int (*cuMemsetD32Async)(uint64_t, unsigned, size_t, void *);
  int (*cuStreamCreate)(void **, unsigned);
  int (*cuStreamIsCapturing)(void *, int *);
  int (*cuStreamBeginCapture)(void *, int);
  int (*cuStreamEndCapture)(void *, void **);
  int (*cuGraphInstantiateWithFlags)(void **, void *, unsigned long long);
  int (*cuGraphLaunch)(void *, void *);
  struct GraphExecUpdateResultInfo {
    int result;
    void *errorNode, *errorFromNode;
  };
  int (*cuGraphExecUpdate)(void *, void *, GraphExecUpdateResultInfo *);
  int (*cuGraphDestroy)(void *);
  int (*cuGraphExecDestroy)(void *);
};

} // namespace moe::rt

#endif // MOE_RUNTIME_DRIVERAPI_H
