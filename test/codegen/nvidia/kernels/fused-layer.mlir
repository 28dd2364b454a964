// RUN: moe-opt %s --moe-sm90a-pipeline="token-buckets=1,128 fuse-layer=1 stop-after=kernels" | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline="token-buckets=1,128 fuse-layer=1 stop-after=ptx" | FileCheck %s --check-prefix=PTX

// Bucket 1 is one cooperative kernel of a block per multiprocessor; 128
// keeps its chain, whose route is the split form (a warp per chunk of 16
// experts' columns for 8 tokens, then a warp per token choosing). The fused
// kernel's steps are bucket 1's chain kernels, built into it and not on
// their own: the router's product on tensor cores from cp.async copies and
// the choice with redux.sync, one virtual block each, so they meet at block
// 0's own barrier; the weights of the experts chosen are then prefetched
// into L2, and the other steps meet at grid barriers (a release reduction
// on a workspace counter, acquire loads until every block has arrived).
// CHECK: moe.bucket_plans = [#moe.launch_plan<
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_fused_layer, {{.*}}persistent = true, cooperative = true>], max_tokens = 1, counters = 1>
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route_product_2, work = 1 * T, per_block = 8, block = 128, shared_bytes = 50176, args = [buffer 0, buffer 1, buffer 7, tokens]>, #moe.launch<kernel = @moe_route_select, work = 1 * T, per_block = 8, block = 256, args = [buffer 7, buffer 5, buffer 6, tokens]>,
// CHECK-SAME: max_tokens = 128>
// CHECK-NOT: gpu.func @moe_route_product_1(
// CHECK-NOT: gpu.func @moe_prefetch_experts
// CHECK: gpu.func @moe_fused_layer(
// CHECK-SAME: workgroup(%{{.*}} : memref<8x16xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: known_block_size = array<i32: 320, 1, 1>
// CHECK: cp.async.cg.shared.global
// CHECK: nvvm.mma.sync {{.*}}multiplicandAPtxType = #nvvm.mma_type<bf16>, multiplicandBPtxType = #nvvm.mma_type<bf16>, shape = #nvvm.shape<m = 16, n = 8, k = 16>
// CHECK-NOT: red.release.gpu.global.add.u32
// CHECK: gpu.barrier
// CHECK-NOT: red.release.gpu.global.add.u32
// CHECK: nvvm.redux.sync umax
// CHECK: red.release.gpu.global.add.u32
// CHECK: ld.acquire.gpu.global.u32
// CHECK: cp.async.bulk.prefetch.L2.global
// CHECK: red.release.gpu.global.add.u32
// CHECK: ld.acquire.gpu.global.u32
// CHECK: nvgpu.tma.async.load
// CHECK: gpu.func @moe_route_product_2({{.*}}known_block_size = array<i32: 128, 1, 1>
// CHECK-NOT: gpu.func @moe_route_product_1(
// PTX: .visible .entry moe_fused_layer(
// PTX: cp.async.cg.shared.global
// PTX: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// PTX: redux.sync.max.u32
// PTX: cp.async.bulk.prefetch.L2.global
// PTX: red.release.gpu.global.add.u32
// PTX: wgmma.mma_async
func.func @small(%x: tensor<?x256xbf16>, %router: tensor<16x256xbf16>,
                 %w13: tensor<16x256x256xbf16>, %w2: tensor<16x256x128xbf16>)
    -> tensor<?x256xbf16> {
  %0 = moe.layer %x router(%router) experts(%w13, %w2)
      {config = #moe.config<experts = 16, top_k = 4, hidden = 256,
                            intermediate = 128,
                            router = <kind = softmax_topk, renormalize = true>,
                            activation = <kind = swiglu>>}
      : (tensor<?x256xbf16>, tensor<16x256xbf16>, tensor<16x256x256xbf16>,
         tensor<16x256x128xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}
