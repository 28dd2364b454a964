// RUN: moe-opt %s --split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// A router of bf16 rows takes its product on tensor cores (mma.sync
// m16n8k16, bf16 operands, f32 sums) in chunks of 256 columns; a second
// kernel, a warp per token, sums the chunks' parts, scores and chooses.
// For any count (no buckets) the product is the block form: the block
// copies each step's rows once with cp.async into a ring 8 steps deep that
// its 8 warps share, each warp summing every chunk for its 16 experts.
// Under 64 experts a warp takes one tile of 8 tokens, so that the blocks
// stay many: here 64 tokens a block, 8 x (16 + 64 rows) x 64 bytes of ring
// (and 1024 to align it), 8 steps x 2 mma.sync a warp. One part a token
// (16 f32) goes through the workspace. The select kernel's warps each keep
// a row of shared scratch (scores, choice keys, taken flags, group scores
// and flags, the chosen weights) and reduce each search across lanes with
// redux.sync (grouped selection here: DeepSeek-V3's router).
// CHECK-LABEL: func.func @route(
// CHECK-SAME: #moe.buffer<bytes = 64 * T>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route_product, work = 1 * T, per_block = 64, block = 256, shared_bytes = 41984, args = [buffer 0, buffer 1, buffer 5, tokens]>, #moe.launch<kernel = @moe_route_select, work = 1 * T, per_block = 8, block = 256, args = [buffer 5, buffer 2, buffer 3, buffer 4, tokens]>]
// CHECK: gpu.func @moe_route_product({{.*}}known_block_size = array<i32: 256, 1, 1>
// CHECK: llvm.inline_asm has_side_effects "cp.async.cg.shared.global [$0], [$1], 16, $2;"
// CHECK: llvm.inline_asm has_side_effects "cp.async.commit_group;"
// A step's copies have landed and every warp is done with the slot the
// next copies fill.
// CHECK: llvm.inline_asm has_side_effects "cp.async.wait_group 6;"
// CHECK-NEXT: gpu.barrier
// CHECK: vector.load {{.*}} : memref<4xi32, #gpu.address_space<workgroup>>, vector<4xi32>
// CHECK-COUNT-16: nvvm.mma.sync {{.*}}layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, multiplicandAPtxType = #nvvm.mma_type<bf16>, multiplicandBPtxType = #nvvm.mma_type<bf16>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : (i32, i32, f32) -> !llvm.struct<(f32, f32, f32, f32)>
// CHECK-NOT: nvvm.mma.sync
// CHECK: gpu.func @moe_route_select({{.*}}) workgroup(%{{.*}} : memref<8x16xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<8x16xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<8x16xi8, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<8x4xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<8x4xi8, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<8x4xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK: nvvm.redux.sync umin
// CHECK: nvvm.redux.sync umax
// CHECK: nvvm.redux.sync umin
// CHECK-NOT: gpu.func
// The pipeline's buckets of up to 512 tokens take the split form
// (moe_route_product_1); larger ones share the kernels above.
// PTX: gpu.binary @route_kernels
// PTX-SAME: .visible .entry moe_route_product(
// PTX-SAME: cp.async.cg.shared.global [
// PTX-SAME: cp.async.wait_group
// PTX-SAME: bar.sync
// PTX-SAME: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// PTX-SAME: .visible .entry moe_route_select(
// PTX-SAME: redux.sync.min.u32
// PTX-SAME: redux.sync.max.u32
// PTX-SAME: .visible .entry moe_route_product_1(
func.func @route(%hidden: tensor<?x64xbf16>, %router: tensor<16x64xbf16>,
                 %bias: tensor<16xf32>) -> (tensor<?x4xi32>, tensor<?x4xf32>) {
  %ids, %weights = moe.route %hidden, %router bias %bias
      {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true,
                            n_group = 4, topk_group = 2, scaling = 2.5>}
      : (tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<16xf32>)
      -> (tensor<?x4xi32>, tensor<?x4xf32>)
  return %ids, %weights : tensor<?x4xi32>, tensor<?x4xf32>
}

// -----

// A bucket of at most 512 tokens has too few tokens to fill the GPU with
// blocks of tokens, so the product takes the split form: a warp one chunk of
// 16 experts for 8 tokens, copied into its own ring (no barrier), four
// chunks a block: grid_y = 8 tiles of 16 experts x ceil(5 chunks / 4), and
// 4 warps x 8 steps x 3 rows x 512 bytes of ring. Each chunk is a part of
// its own in the workspace (5 x 128 f32 a token); the select kernel adds the
// parts in order, as the block form adds its chunks, so every bucket
// chooses the same experts with the same weights (a stripe of 32 experts a
// warp, four warps a token). The kernels for any
// count are the block form (64 experts by 64 tokens a block, a warp 16
// experts by 32 tokens; 2 blocks on y). Both forms' select kernels store
// the router logits.
// CHECK-LABEL: func.func @route_buckets(
// CHECK-SAME: moe.bucket_plans = [#moe.launch_plan<
// CHECK-SAME: #moe.buffer<bytes = 2560 * T>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route_product_1, work = 1 * T, per_block = 8, grid_y = 16, block = 128, shared_bytes = 50176, args = [buffer 0, buffer 1, buffer 5, tokens]>, #moe.launch<kernel = @moe_route_select_1, work = 1 * T, block = 128, args = [buffer 5, buffer 2, buffer 3, buffer 4, tokens]>], max_tokens = 8>]
// CHECK-SAME: moe.launch_plan = #moe.launch_plan<
// CHECK-SAME: #moe.buffer<bytes = 512 * T>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route_product, work = 1 * T, per_block = 64, grid_y = 2, block = 256, shared_bytes = 66560, args = [buffer 0, buffer 1, buffer 5, tokens]>, #moe.launch<kernel = @moe_route_select, work = 1 * T, per_block = 8, block = 256, args = [buffer 5, buffer 2, buffer 3, buffer 4, tokens]>]>
// The block form's warp sums all 5 chunks in order, each 8 steps x 2
// halves x 4 token tiles: the first chunk starts the 16 sums, chunks 1 to
// 3 are one loop carrying them (the kernel does not grow with K), and the
// last waits for fewer copies as they run out.
// CHECK: gpu.func @moe_route_product(
// CHECK-COUNT-64: nvvm.mma.sync
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK-COUNT-64: nvvm.mma.sync
// CHECK: scf.yield
// CHECK-COUNT-64: nvvm.mma.sync
// CHECK-NOT: nvvm.mma.sync
// CHECK: gpu.func @moe_route_select(
// CHECK-NOT: arith.addf
// CHECK: memref.store %{{.*}}, %{{.*}}[%{{.*}}, %{{.*}}] : memref<?x128xf32>
// The split form's warp: one chunk (8 steps x 2 halves), no barrier.
// CHECK: gpu.func @moe_route_product_1({{.*}}known_block_size = array<i32: 128, 1, 1>
// CHECK-NOT: gpu.barrier
// CHECK: llvm.inline_asm has_side_effects "cp.async.cg.shared.global [$0], [$1], 16, $2;"
// CHECK-NOT: gpu.barrier
// CHECK-COUNT-16: nvvm.mma.sync {{.*}}shape = #nvvm.shape<m = 16, n = 8, k = 16>
// CHECK-NOT: nvvm.mma.sync
// CHECK-NOT: gpu.barrier
// The split form's parts: a token takes a block of 4 warps, a stripe of
// 32 experts a warp, adding its 5 parts in order; after a barrier the first
// warp chooses from the block's one row of scratch.
// CHECK: gpu.func @moe_route_select_1({{.*}}) workgroup(%{{.*}} : memref<1x128xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: %[[S1:.*]] = arith.addf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[S2:.*]] = arith.addf %[[S1]], %{{.*}} : f32
// CHECK-NEXT: %[[S3:.*]] = arith.addf %[[S2]], %{{.*}} : f32
// CHECK-NEXT: %[[LOGIT:.*]] = arith.addf %[[S3]], %{{.*}} : f32
// CHECK: memref.store %[[LOGIT]], %{{.*}}[%{{.*}}, %{{.*}}] : memref<?x128xf32>
// CHECK: gpu.barrier
// CHECK: nvvm.redux.sync umax
// CHECK-NOT: gpu.func
// PTX: gpu.binary @route_buckets_kernels
// PTX-SAME: .visible .entry moe_route_product(
// PTX-SAME: .visible .entry moe_route_select(
// PTX-SAME: .visible .entry moe_route_product_1(
// PTX-SAME: .maxntid 128, 1, 1
// PTX-SAME: cp.async.cg.shared.global [
// PTX-NOT: bar.sync
// PTX-SAME: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// PTX-NOT: bar.sync
// PTX-SAME: .visible .entry moe_route_select_1(
// PTX-SAME: redux.sync.max.u32
func.func @route_buckets(%hidden: tensor<?x1280xbf16>, %router: tensor<128x1280xbf16>)
    -> (tensor<?x8xi32>, tensor<?x8xf32>, tensor<?x128xf32>)
    attributes {moe.token_buckets = array<i64: 8>} {
  %ids, %weights, %logits = moe.route %hidden, %router
      {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x1280xbf16>, tensor<128x1280xbf16>)
      -> (tensor<?x8xi32>, tensor<?x8xf32>, tensor<?x128xf32>)
  return %ids, %weights, %logits : tensor<?x8xi32>, tensor<?x8xf32>, tensor<?x128xf32>
}

// -----

// A router of f32 rows (as one whose width is not a multiple of 8) keeps
// its logits on CUDA cores: a block per four tokens (256 threads); warps
// read the rows in 8-element vectors, reduce each logit across lanes with
// shuffles into 16-byte aligned shared scratch, and a warp per token
// chooses. No tensor cores, no copies to shared memory.
// CHECK-LABEL: func.func @route_f32(
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_route, work = 1 * T, per_block = 4, block = 256, args = [buffer 0, buffer 1, buffer 2, buffer 3, buffer 4, tokens]>]
// CHECK: gpu.func @moe_route({{.*}}) workgroup(%{{.*}} : memref<4x16xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}
// CHECK-SAME: memref<4x4xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}
// CHECK-NOT: nvvm.mma.sync
// CHECK: vector.load {{.*}} : memref<16x64xf32>, vector<8xf32>
// CHECK: vector.load {{.*}} vector<8xbf16>
// CHECK: gpu.shuffle xor
// CHECK: gpu.barrier
// CHECK: nvvm.redux.sync umax
// CHECK-NOT: nvvm.mma.sync
// PTX: gpu.binary @route_f32_kernels
// PTX-SAME: .visible .entry moe_route(
// PTX-SAME: ld.global.v4.b32
// PTX-SAME: shfl.sync.bfly.b32
// PTX-SAME: bar.sync
// PTX-SAME: .visible .entry moe_route_logits(
// PTX-SAME: .visible .entry moe_route_select(
// PTX-NOT: mma.sync
// PTX-NOT: cp.async
func.func @route_f32(%hidden: tensor<?x64xbf16>, %router: tensor<16x64xf32>,
                     %bias: tensor<16xf32>) -> (tensor<?x4xi32>, tensor<?x4xf32>) {
  %ids, %weights = moe.route %hidden, %router bias %bias
      {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true,
                            n_group = 4, topk_group = 2, scaling = 2.5>}
      : (tensor<?x64xbf16>, tensor<16x64xf32>, tensor<16xf32>)
      -> (tensor<?x4xi32>, tensor<?x4xf32>)
  return %ids, %weights : tensor<?x4xi32>, tensor<?x4xf32>
}

// -----

// 300 experts are 10 stripes of 32, more than a block's 8 warps: a warp
// sums two stripes' parts (experts lane + 32 (warp + 8 j), the last
// stripe's loads clamped to expert 299 and its stores guarded), then after
// the barrier the first warp chooses from the block's one row of 300.
// CHECK-LABEL: func.func @route_wide(
// CHECK-SAME: #moe.launch<kernel = @moe_route_select_1, work = 1 * T, block = 256, args = [buffer 4, buffer 2, buffer 3, tokens]>
// CHECK: gpu.func @moe_route_select_1({{.*}}) workgroup(%{{.*}} : memref<1x300xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK: %[[C299:.*]] = arith.constant 299 : index
// CHECK: arith.minui %{{.*}}, %[[C299]] : index
// CHECK: %[[C299B:.*]] = arith.constant 299 : index
// CHECK: arith.minui %{{.*}}, %[[C299B]] : index
// CHECK-NOT: arith.minui
// CHECK: gpu.barrier
// CHECK: nvvm.redux.sync umax
// PTX: gpu.binary @route_wide_kernels
// PTX-SAME: .visible .entry moe_route_select_1(
// PTX-SAME: .maxntid 256, 1, 1
// PTX-SAME: bar.sync
// PTX-SAME: redux.sync.max.u32
func.func @route_wide(%hidden: tensor<?x512xbf16>, %router: tensor<300x512xbf16>)
    -> (tensor<?x8xi32>, tensor<?x8xf32>)
    attributes {moe.token_buckets = array<i64: 8>} {
  %ids, %weights = moe.route %hidden, %router
      {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x512xbf16>, tensor<300x512xbf16>)
      -> (tensor<?x8xi32>, tensor<?x8xf32>)
  return %ids, %weights : tensor<?x8xi32>, tensor<?x8xf32>
}
