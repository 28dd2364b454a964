// RUN: moe-opt %s -split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The grouped matmul's decode tile (swap_ab), as its configuration pins it:
// the weights are wgmma's M side in 64-row fragments (a gated tile of 128
// takes a gate and an up fragment), an expert's rows its N (tile_m = 8),
// one consumer warpgroup and a producer warp (160 threads) over a ring of
// six stages of 128 bytes of K, small enough that two blocks share a
// multiprocessor: 6 x (8 + 128) x 128 + 1024 = 105472 bytes. A bucket of
// 4 tokens has at most 4 row tiles (x); 2 column tiles x 2 K splits (y).
// (The bucket's kernels are named _1, after those for any count.)
// CHECK-LABEL: func.func @gated_split
// CHECK: #moe.launch<kernel = @moe_grouped_matmul_1, work = 4, grid_y = 4, block = 160, shared_bytes = 105472
// Its threads hold at most 168 registers (.maxnreg): two blocks' ten warps
// put three on one scheduler, whose quarter of the register file they
// share.
// CHECK: gpu.func @moe_grouped_matmul_1(
// CHECK-SAME: known_block_size = array<i32: 160, 1, 1>
// CHECK-SAME: nvvm.maxnreg = 168 : i32
// Every block walks its row tiles a grid apart, the ring's position
// carried from tile to tile.
// CHECK: scf.for {{.*}} iter_args(%{{.*}} = %{{.*}}) -> (index)
// The tile's last split adds the splits' partials a split at a time: a
// loop carrying the tile's 8 sums in split order (unrolled, a thread held
// every split's partials at once and spilled).
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK-NOT: nvvm.setmaxnreg
// CHECK: gpu.return
// The mbarriers initialized once (a full and an empty one a stage), then
// the producer warp's thread fills a slot with both fragments' weights and
// the tile's rows (three TMA boxes, one expect_tx), and the consumers run
// the eight m64n8k16 of a stage (two fragments x four K steps) and release
// the previous stage's slot once its wgmma are done.
// PTX-LABEL: .visible .entry moe_grouped_matmul_1(
// PTX: .maxntid 160, 1, 1{{\\0A}}.maxnreg 168
// PTX-COUNT-12: mbarrier.init.shared.b64
// PTX: fence.mbarrier_init.release.cluster;
// PTX: mbarrier.try_wait.parity.shared.b64
// PTX: wgmma.fence.sync.aligned;
// PTX-COUNT-8: wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16
// PTX: wgmma.commit_group.sync.aligned;
// PTX: wgmma.wait_group.sync.aligned {{[^;]*}}1;
// PTX: mbarrier.arrive.shared::cta.b64
// PTX: wgmma.wait_group.sync.aligned {{[^;]*}}0;
// Split K: each split stores its f32 partials, the tile's splits count
// themselves in on its counter behind the consumers' barrier, and the last
// sums them and runs the SwiGLU epilogue (silu through ex2) into bf16.
// PTX: st.global.b32
// PTX: fence.acq_rel.gpu;
// PTX: bar.sync {{[^,]*}}, 128;
// PTX: atom.global.add.u32 {{[^,]*}}, {{[^,]*}}, 1;
// PTX: bar.sync {{[^,]*}}, 128;
// PTX: fence.acq_rel.gpu;
// PTX: ex2.approx.ftz.f32
// PTX: st.global.b16
// PTX: mbarrier.try_wait.parity.shared.b64
// PTX: mbarrier.arrive.expect_tx.shared.b64
// PTX-COUNT-3: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
func.func @gated_split(%x: tensor<?x512xbf16>, %w: tensor<8x256x512xbf16>,
                       %counts: tensor<8xi32>, %offsets: tensor<9xi32>)
    -> tensor<?x128xbf16> attributes {moe.token_buckets = array<i64: 4>} {
  %0 = moe.grouped_matmul %x, %w groups(%counts, %offsets)
      {activation = #moe.activation<kind = swiglu>, configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>, #moe.matmul_config<tokens = 4, tile_m = 8, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, split_k = 2, swap_ab = true>]}
      : (tensor<?x512xbf16>, tensor<8x256x512xbf16>, tensor<8xi32>,
         tensor<9xi32>) -> tensor<?x128xbf16>
  return %0 : tensor<?x128xbf16>
}

// -----

// FP8 block-128: each 128-wide scale block of a stage goes into fresh
// partials (m64n16k32 over E4M3, the stage's two fragments), which are
// scaled by row scale x weight scale into the accumulators with one
// multiply-add each; the scales are read before the stage's wait.
// CHECK-LABEL: func.func @fp8
// CHECK: #moe.launch<kernel = @moe_matmul_1, work = 1, grid_y = 2, block = 160
// PTX-LABEL: .visible .entry moe_matmul_1(
// PTX: .maxntid 160, 1, 1
// PTX: ld.global.b32
// PTX: mbarrier.try_wait.parity.shared.b64
// PTX-COUNT-4: wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3
// PTX: wgmma.wait_group.sync.aligned {{[^;]*}}0;
// PTX: fma.rn.f32
func.func @fp8(%x: tensor<?x256xf8E4M3FN>, %sx: tensor<?x2xf32>,
               %b: tensor<256x256xf8E4M3FN>, %sb: tensor<2x2xf32>)
    -> tensor<?x256xbf16> attributes {moe.token_buckets = array<i64: 16>} {
  %0 = moe.grouped_matmul %x, %b scales(%sx, %sb) {configs = [#moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 128, stages = 4>, #moe.matmul_config<tokens = 16, tile_m = 16, tile_n = 128, tile_k = 128, stages = 3, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x256xf8E4M3FN>, tensor<256x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<2x2xf32>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}
