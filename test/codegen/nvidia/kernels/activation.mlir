// RUN: moe-opt %s -split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The training forward's activation step: a block per row of 128 threads,
// the CPU backend's arithmetic (SiLU through exp).
// CHECK-LABEL: func.func @forward
// CHECK: launches = [#moe.launch<kernel = @moe_activation, work = 1 * T, block = 128, args = [buffer 0, buffer 1, tokens]>]
// CHECK: gpu.func @moe_activation(
// CHECK: math.exp
// PTX-LABEL: .visible .entry moe_activation(
// PTX-SAME: ex2.approx
func.func @forward(%h: tensor<?x200xbf16>) -> tensor<?x100xbf16> {
  %0 = moe.activation %h {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x200xbf16>) -> tensor<?x100xbf16>
  return %0 : tensor<?x100xbf16>
}

// -----

// Quantized for the down matmul: each thread 8 columns of a 1024-column
// stride, a 128-column block's 16 lanes combining its largest magnitude (and
// whether it holds NaN or an infinity) by four shuffles; its codes one
// 8-byte store. 2880 columns end in half a block, whose lanes past the row
// add nothing. 100 columns (no 16-byte pieces) take a thread a block.
// CHECK-LABEL: func.func @quantized(
// CHECK: launches = [#moe.launch<kernel = @moe_activation, work = 1 * T, block = 128, args = [buffer 0, buffer 1, buffer 2, tokens]>]
// CHECK-LABEL: gpu.module @quantized_kernels
// CHECK-COUNT-8: gpu.shuffle xor
// CHECK: vector.store {{.*}} vector<8xi8>
// CHECK-LABEL: gpu.module @quantized_unaligned_kernels
// CHECK-NOT: gpu.shuffle
// PTX-LABEL: .visible .entry moe_activation(
// PTX-SAME: cvt.rn.satfinite.e4m3x2.f32
func.func @quantized(%h: tensor<?x5760xbf16>)
    -> (tensor<?x2880xf8E4M3FN>, tensor<?x23xf32>) {
  %0, %1 = moe.activation %h {activation = #moe.activation<kind = swiglu>,
      quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x5760xbf16>) -> (tensor<?x2880xf8E4M3FN>, tensor<?x23xf32>)
  return %0, %1 : tensor<?x2880xf8E4M3FN>, tensor<?x23xf32>
}
func.func @quantized_unaligned(%h: tensor<?x200xbf16>)
    -> (tensor<?x100xf8E4M3FN>, tensor<?x1xf32>) {
  %0, %1 = moe.activation %h {activation = #moe.activation<kind = swiglu>,
      quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x200xbf16>) -> (tensor<?x100xf8E4M3FN>, tensor<?x1xf32>)
  return %0, %1 : tensor<?x100xf8E4M3FN>, tensor<?x1xf32>
}

// -----

// The backward of routed rows: a warp per token (4 a block), each choice's
// row in turn; the weight's gradient summed across the warp by shuffles
// and stored by its first lane.
// CHECK-LABEL: func.func @routed
// CHECK: launches = [#moe.launch<kernel = @moe_activation_grad, work = 1 * T, per_block = 4, block = 128, args = [buffer 0, buffer 1, buffer 5, buffer 6, buffer 4, buffer 2, buffer 3, tokens]>]
// CHECK: gpu.func @moe_activation_grad(
// CHECK-COUNT-5: gpu.shuffle xor
// PTX-LABEL: .visible .entry moe_activation_grad(
// PTX-SAME: shfl.sync.bfly.b32
func.func @routed(%g: tensor<?x100xbf16>, %h: tensor<?x200xbf16>,
                  %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>)
    -> tensor<?x2xf32> {
  %0, %1, %2 = moe.activation_grad %g, %h rows(%rows, %w)
      {activation = #moe.activation<kind = clamped_swiglu, alpha = 1.702,
                                    limit = 7.0>}
      : (tensor<?x100xbf16>, tensor<?x200xbf16>, tensor<?x2xi32>,
         tensor<?x2xf32>)
      -> (tensor<?x200xbf16>, tensor<?x100xbf16>, tensor<?x2xf32>)
  return %2 : tensor<?x2xf32>
}

// -----

// The shared experts' gate: a warp per row; the gate's gradient is the
// dot times the sigmoid's derivative.
// CHECK-LABEL: func.func @gated
// CHECK: launches = [#moe.launch<kernel = @moe_activation_grad, work = 1 * T, per_block = 4, block = 128, args = [buffer 0, buffer 1, buffer 4, buffer 5, buffer 3, buffer 2, tokens]>]
func.func @gated(%g: tensor<?x100xbf16>, %h: tensor<?x200xbf16>,
                 %s: tensor<?x1xbf16>) -> tensor<?x1xf32> {
  %0, %1, %2 = moe.activation_grad %g, %h gate %s
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x100xbf16>, tensor<?x200xbf16>, tensor<?x1xbf16>)
      -> (tensor<?x200xbf16>, tensor<?x100xbf16>, tensor<?x1xf32>)
  return %2 : tensor<?x1xf32>
}
