// RUN: moe-opt %s --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// Combine: a block per token sums its weighted expert rows, then the gated
// shared expert, in f32 with 16-byte vectors.
// CHECK: launches = [#moe.launch<kernel = @moe_combine, work = 1 * T, block = 128, args = [buffer 0, buffer 1, buffer 5, buffer 2, buffer 3, buffer 4, tokens]>]
// CHECK: gpu.func @moe_combine(
// CHECK: vector.load {{.*}} vector<8xbf16>
// CHECK: vector.store {{.*}} vector<8xbf16>
// PTX: .visible .entry moe_combine(
// PTX-SAME: ld.global.v4.b32
// PTX-SAME: st.global.v4.b32
func.func @combine(%expert_out: tensor<?x64xbf16>, %rows: tensor<?x2xi32>,
                   %weights: tensor<?x2xf32>, %shared: tensor<?x64xbf16>,
                   %gate: tensor<?x1xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.combine %expert_out, %rows weights %weights shared %shared gate %gate
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x64xbf16>,
         tensor<?x1xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}
