// RUN: moe-opt %s --moe-sm90a-pipeline="token-buckets=1,128 fuse-layer=1 stop-after=kernels" | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline="token-buckets=1,128 fuse-layer=1 stop-after=ptx" | FileCheck %s --check-prefix=PTX

// Bucket 1 is one cooperative kernel of a block per multiprocessor; 128
// keeps its chain. Its steps are the chain's kernels: the weights of the
// experts chosen are prefetched into L2 after routing, and the steps meet
// at grid barriers (a release reduction on a workspace counter, acquire
// loads until every block has arrived).
// CHECK: moe.bucket_plans = [#moe.launch_plan<
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_fused_layer, {{.*}}persistent = true, cooperative = true>], max_tokens = 1, counters = 1>
// CHECK-SAME: #moe.launch<kernel = @moe_route,
// CHECK-NOT: gpu.func @moe_route_logits
// CHECK-NOT: gpu.func @moe_prefetch_experts
// CHECK: gpu.func @moe_fused_layer(
// CHECK-SAME: known_block_size = array<i32: 320, 1, 1>
// CHECK: cp.async.bulk.prefetch.L2.global
// CHECK: red.release.gpu.global.add.u32
// CHECK: ld.acquire.gpu.global.u32
// CHECK: nvgpu.tma.async.load
// PTX: .visible .entry moe_fused_layer(
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
