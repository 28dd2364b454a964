// RUN: moe-opt %s --moe-mark-tensor-map-params | FileCheck %s

// The parameters the kernel builder listed become 128-byte descriptors passed
// by value, read in place (__grid_constant__); the list goes.
// CHECK-LABEL: llvm.func @kernel
// CHECK-SAME: %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr {llvm.align = 64 : i64, llvm.byval = !llvm.array<128 x i8>, nvvm.grid_constant}, %{{.*}}: i64)
// CHECK-NOT: moe.tensor_map_args
gpu.module @kernels {
  llvm.func @kernel(%out: !llvm.ptr, %map: !llvm.ptr, %tokens: i64)
      attributes {moe.tensor_map_args = array<i64: 1>, nvvm.kernel} {
    llvm.return
  }
}
