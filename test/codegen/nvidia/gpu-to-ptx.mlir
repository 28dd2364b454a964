// The upstream NVVM pipeline, with the registrations codegen/nvidia makes,
// takes a kernel to PTX for sm_90a (and, where ptxas is installed, to a cubin
// that ptxas accepts).
// RUN: moe-opt %s --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa" | FileCheck %s
// RUN: %if ptxas %{ moe-opt %s --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=bin" | FileCheck %s --check-prefix=CUBIN %}

// CHECK: gpu.binary @kernels
// CHECK-SAME: .target sm_90a
// CHECK-SAME: .visible .entry scale(
// CHECK-SAME: ld.global
// CUBIN: gpu.binary @kernels
// CUBIN-SAME: bin = "\7FELF
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @scale(%x: memref<1024xf32>, %y: memref<1024xf32>, %a: f32) kernel {
      %block = gpu.block_id x
      %thread = gpu.thread_id x
      %dim = gpu.block_dim x
      %base = arith.muli %block, %dim : index
      %i = arith.addi %base, %thread : index
      %v = memref.load %x[%i] : memref<1024xf32>
      %r = arith.mulf %v, %a : f32
      memref.store %r, %y[%i] : memref<1024xf32>
      gpu.return
    }
  }
}
