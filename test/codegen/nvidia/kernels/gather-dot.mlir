// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// Llama-4's routing weight gradient: a warp per token (8 a block), each
// choice's row dotted with the token, summed by shuffles; a choice with no
// row gives 0.
// CHECK-LABEL: func.func @gather_dot
// CHECK: launches = [#moe.launch<kernel = @moe_gather_dot, work = 1 * T, per_block = 8, block = 256, args = [buffer 0, buffer 1, buffer 2, buffer 3, tokens]>]
// CHECK-COUNT-5: gpu.shuffle xor
// PTX-LABEL: .visible .entry moe_gather_dot(
// PTX: shfl.sync.bfly.b32
func.func @gather_dot(%rows_in: tensor<?x96xbf16>, %x: tensor<?x96xbf16>,
                      %rows: tensor<?x1xi32>) -> tensor<?x1xf32> {
  %0 = moe.gather_dot %rows_in, %x rows %rows
      : (tensor<?x96xbf16>, tensor<?x96xbf16>, tensor<?x1xi32>)
      -> tensor<?x1xf32>
  return %0 : tensor<?x1xf32>
}
