// RUN: moe-opt %s -split-input-file --moe-build-kernels -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx -verify-diagnostics | FileCheck %s --check-prefix=PTX

// The backward's scatter: a block per token copies its row, times its
// routing weight, to the rows the forward's dispatch gave its choices, with
// 16-byte vectors; the layout itself (offsets) is the forward's, so no plan.
// CHECK-LABEL: func.func @weighted
// CHECK: launches = [#moe.launch<kernel = @moe_scatter, work = 1 * T, block = 128, args = [buffer 0, buffer 1, buffer 4, buffer 3, tokens]>]
// CHECK: gpu.func @moe_scatter(
// CHECK: vector.load {{.*}} vector<8xbf16>
// CHECK: arith.mulf {{.*}} : vector<8xf32>
// CHECK: vector.store {{.*}} vector<8xbf16>
// PTX-LABEL: .visible .entry moe_scatter(
// PTX-SAME: ld.global.v4.b32
// PTX-SAME: st.global.v4.b32
func.func @weighted(%g: tensor<?x200xbf16>, %rows: tensor<?x3xi32>,
                    %off: tensor<11xi32>, %w: tensor<?x3xf32>)
    -> tensor<?x200xbf16> {
  %0 = moe.scatter %g, %rows offsets %off scale %w
      : (tensor<?x200xbf16>, tensor<?x3xi32>, tensor<11xi32>, tensor<?x3xf32>)
      -> tensor<?x200xbf16>
  return %0 : tensor<?x200xbf16>
}

// -----

// Padding between experts would stay unwritten.
func.func @aligned(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>,
                   %off: tensor<9xi32>) -> tensor<?x64xbf16> {
  // expected-error @+1 {{aligns expert rows to 128, which sm_90a's scatter does not take}}
  %0 = moe.scatter %g, %rows offsets %off {align = 128}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}
