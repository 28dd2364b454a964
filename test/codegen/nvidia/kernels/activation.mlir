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
