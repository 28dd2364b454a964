// RUN: moe-opt %s --moe-extern-dynamic-shared | FileCheck %s
// RUN: moe-compile %S/../../../tools/Inputs/attention/gqa_causal.mlir --target=sm_90a --emit=ptx -o - | FileCheck %s --check-prefix=PTX

// The zero-sized shared global gpu.dynamic_shared_memory becomes is made
// external; other shared globals (an mbarrier) and globals elsewhere stay
// as they are. In PTX the kernels' dynamic shared memory is then the
// extern array that starts after their static shared variables.
// CHECK: llvm.mlir.global external @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
// CHECK: llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<1 x i64>
// CHECK: llvm.mlir.global internal @table() {addr_space = 1 : i32} : !llvm.array<0 x i8>
// PTX: .extern .shared .align 16 .b8 __dynamic_shmem__0[];
gpu.module @kernels {
  llvm.mlir.global internal @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
  llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<1 x i64>
  llvm.mlir.global internal @table() {addr_space = 1 : i32} : !llvm.array<0 x i8>
}
