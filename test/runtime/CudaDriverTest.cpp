//===- CudaDriverTest.cpp - the runtime's CUDA driver on a real GPU -------===//
//
// Runs on the GPU machine; elsewhere it checks that the missing driver is
// reported plainly and skips, saying why.
//
//===----------------------------------------------------------------------===//

#include "runtime/CudaDriver.h"

#include <gtest/gtest.h>
#include <vector>

using namespace moe::rt;

// y[i] = x[i] * a for i < n: a test kernel in PTX, which the driver JIT-
// compiles for whatever GPU is present.
static const char *kScalePtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 x, .param .u64 y, .param .f32 a,
                      .param .u32 n) {
  .reg .pred %p;
  .reg .b32 %r<5>;
  .reg .f32 %f<3>;
  .reg .b64 %rd<7>;
  ld.param.u64 %rd1, [x];
  ld.param.u64 %rd2, [y];
  ld.param.f32 %f1, [a];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r2, %r2, %r3, %r4;
  setp.ge.u32 %p, %r2, %r1;
  @%p bra done;
  mul.wide.u32 %rd3, %r2, 4;
  add.s64 %rd4, %rd1, %rd3;
  add.s64 %rd5, %rd2, %rd3;
  ld.global.f32 %f2, [%rd4];
  mul.f32 %f2, %f2, %f1;
  st.global.f32 [%rd5], %f2;
done:
  ret;
}
)";

TEST(CudaDriver, RunsAKernelOrSaysWhyNot) {
  std::string error;
  std::unique_ptr<CudaDevice> device = CudaDevice::open(0, error);
  if (!device) {
    EXPECT_NE(error.find("CUDA"), std::string::npos) << error;
    GTEST_SKIP() << "no usable GPU: " << error;
  }
  std::printf("device: %s (sm_%d)\n", device->name().c_str(),
              device->computeCapability());
  void *module = device->loadModule(kScalePtx, error);
  ASSERT_TRUE(module) << error;
  void *function = device->getFunction(module, "scale", error);
  ASSERT_TRUE(function) << error;
  EXPECT_FALSE(device->getFunction(module, "missing", error));
  EXPECT_NE(error.find("cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"),
            std::string::npos)
      << error;

  unsigned n = 1000;
  std::vector<float> x(n), y(n, -1.0f);
  for (unsigned i = 0; i < n; ++i)
    x[i] = 0.5f * i;
  CudaDevice::DevicePtr dx = device->allocate(n * 4, error);
  CudaDevice::DevicePtr dy = device->allocate(n * 4, error);
  ASSERT_TRUE(dx && dy) << error;
  ASSERT_TRUE(device->copyToDevice(dx, x.data(), n * 4, error)) << error;
  ASSERT_TRUE(device->copyToDevice(dy, y.data(), n * 4, error)) << error;
  float a = 3.0f;
  void *args[] = {&dx, &dy, &a, &n};
  ASSERT_TRUE(device->launch(function, (n + 255) / 256, 256, 0, args, error))
      << error;
  ASSERT_TRUE(device->copyToHost(y.data(), dy, n * 4, error)) << error;
  for (unsigned i = 0; i < n; ++i)
    ASSERT_EQ(y[i], 1.5f * i) << i;
  device->free(dx);
  device->free(dy);
}

TEST(CudaDriver, RejectsAMissingDevice) {
  std::string error;
  EXPECT_FALSE(CudaDevice::open(4096, error));
  EXPECT_FALSE(error.empty());
}
