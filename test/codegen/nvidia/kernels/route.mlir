// RUN: moe-opt %s --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The routing kernel: a block per four tokens (256 threads); warps read the
// router weights with 16-byte vectors, reduce logits across lanes with
// shuffles into 16-byte aligned shared scratch, and one lane per token
// chooses its experts (grouped selection here: DeepSeek-V3's router).
// CHECK: launches = [#moe.launch<kernel = @moe_route, work = 1 * T, per_block = 4, block = 256, args = [buffer 0, buffer 1, buffer 2, buffer 3, buffer 4, tokens]>]
// CHECK: gpu.func @moe_route({{.*}}) workgroup(%{{.*}} : memref<4x16xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}
// CHECK-SAME: memref<4x4xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}
// CHECK: vector.load {{.*}} vector<8xbf16>
// CHECK: gpu.shuffle xor
// CHECK: gpu.barrier
// PTX: .visible .entry moe_route(
// PTX-SAME: ld.global.v4.b32
// PTX-SAME: shfl.sync.bfly.b32
// PTX-SAME: bar.sync
func.func @route(%hidden: tensor<?x64xbf16>, %router: tensor<16x64xbf16>,
                 %bias: tensor<16xf32>) -> (tensor<?x4xi32>, tensor<?x4xf32>) {
  %ids, %weights = moe.route %hidden, %router bias %bias
      {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true,
                            n_group = 4, topk_group = 2, scaling = 2.5>}
      : (tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<16xf32>)
      -> (tensor<?x4xi32>, tensor<?x4xf32>)
  return %ids, %weights : tensor<?x4xi32>, tensor<?x4xf32>
}
