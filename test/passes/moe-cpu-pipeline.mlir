// RUN: moe-opt %s --moe-cpu-pipeline | FileCheck %s

// The CPU target's stages (passes/Pipelines.cpp): a whole layer is
// decomposed, lowered to loops and then to the LLVM dialect; the result is
// written into a trailing output argument. Only the interface
// (moe-export-interface) stays, for the library to be rendered from.
// CHECK: llvm.func @malloc
// CHECK: llvm.func @layer({{.*}}moe.interface = #moe.interface<name = "layer", target = cpu{{.*}}
// CHECK-NOT: moe.
// CHECK-NOT: memref.
// CHECK-NOT: scf.
func.func @layer(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
                 %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>)
    -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>)
      -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}
