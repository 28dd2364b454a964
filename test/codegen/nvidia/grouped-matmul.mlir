// RUN: moe-opt %s --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The grouped matmul: tiles of 128 rows x 256 weight rows. Each operand has a
// TMA descriptor (128-row boxes of 64 bf16), passed by value; the grid has a
// row tile per 128 rows plus one per expert (segments start anywhere), and a
// column tile per 128 outputs with an activation (gate and up halves): one
// here.
// CHECK: tensor_maps = [#moe.tensor_map<buffer = 0, element_bytes = 2, rows = 1 * T, cols = 64, box_rows = 128, box_cols = 64>, #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 2048, cols = 64, box_rows = 128, box_cols = 64>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul, work = 1 * T, per_block = 128, extra_blocks = 8, block = 256, shared_bytes = 197632, args = [buffer 5, buffer 2, buffer 3, buffer 4, tensor_map 0, tensor_map 1, tokens]>]
// CHECK: gpu.func @moe_grouped_matmul({{.*}}) kernel attributes {moe.tensor_map_args = array<i64: 4, 5>}
// CHECK: nvgpu.mbarrier.create
// CHECK: nvgpu.tma.async.load
// CHECK: nvvm.wgmma.mma_async
// PTX: .visible .entry moe_grouped_matmul(
// PTX-SAME: .param .align 64 .b8 moe_grouped_matmul_param_4[128]
// PTX-SAME: mbarrier.init.shared.b64
// PTX-SAME: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-SAME: mbarrier.try_wait.parity.shared.b64
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// PTX-SAME: wgmma.wait_group.sync.aligned
func.func @gate_up(%x: tensor<?x64xbf16>, %w13: tensor<8x256x64xbf16>,
                   %counts: tensor<8xi32>, %offsets: tensor<9xi32>,
                   %bias: tensor<8x256xf32>) -> tensor<?x128xbf16> {
  %0 = moe.grouped_matmul %x, %w13 groups(%counts, %offsets) bias %bias
      {activation = #moe.activation<kind = clamped_swiglu>}
      : (tensor<?x64xbf16>, tensor<8x256x64xbf16>, tensor<8xi32>, tensor<9xi32>,
         tensor<8x256xf32>) -> tensor<?x128xbf16>
  return %0 : tensor<?x128xbf16>
}
