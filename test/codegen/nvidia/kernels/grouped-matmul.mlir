// RUN: moe-opt %s --split-input-file --moe-configure-matmuls --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The grouped matmul: tiles of 128 rows x 256 weight rows. Each operand has a
// TMA descriptor (128-row boxes of 64 bf16), passed by value; the grid has a
// row tile per 128 rows plus one per expert (segments start anywhere), and a
// column tile per 128 outputs with an activation (gate and up halves): one
// here.
// CHECK: tensor_maps = [#moe.tensor_map<buffer = 0, element_bytes = 2, rows = 1 * T, cols = 64, box_rows = 128, box_cols = 64>, #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 2048, cols = 64, box_rows = 128, box_cols = 64>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul, work = 1 * T, per_block = 128, extra_blocks = 8, block = 384, shared_bytes = 214016, args = [buffer 5, buffer 2, buffer 3, buffer 4, tensor_map 0, tensor_map 1, tokens]>]
// CHECK: gpu.func @moe_grouped_matmul({{.*}}) kernel attributes {known_block_size = array<i32: 384, 1, 1>, moe.tensor_map_args = array<i64: 4, 5>}
// CHECK: nvgpu.mbarrier.create
// CHECK: nvvm.wgmma.mma_async
// CHECK: nvgpu.tma.async.load
// PTX: .visible .entry moe_grouped_matmul(
// PTX-SAME: .param .align 64 .b8 moe_grouped_matmul_param_4[128]
// PTX-SAME: mbarrier.init.shared.b64
// PTX-SAME: mbarrier.try_wait.parity.shared.b64
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// PTX-SAME: wgmma.wait_group.sync.aligned
// PTX-SAME: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
func.func @gate_up(%x: tensor<?x64xbf16>, %w13: tensor<8x256x64xbf16>,
                   %counts: tensor<8xi32>, %offsets: tensor<9xi32>,
                   %bias: tensor<8x256xf32>) -> tensor<?x128xbf16> {
  %0 = moe.grouped_matmul %x, %w13 groups(%counts, %offsets) bias %bias
      {activation = #moe.activation<kind = clamped_swiglu>}
      : (tensor<?x64xbf16>, tensor<8x256x64xbf16>, tensor<8xi32>, tensor<9xi32>,
         tensor<8x256xf32>) -> tensor<?x128xbf16>
  return %0 : tensor<?x128xbf16>
}

// -----

// FP8 block-128: E4M3 operands in 128-byte boxes (128 codes), two m64n128k32
// wgmma halves per 128 of K into a fresh partial, which the scales promote
// into the accumulator. The up half of this tile starts 32 rows into a
// 128-row weight block (I = 160), so its columns take one of two scales.
// CHECK: tensor_maps = [#moe.tensor_map<buffer = {{[0-9]+}}, element_bytes = 1, rows = 1 * T, cols = 256, box_rows = 128, box_cols = 128>
// CHECK-SAME: #moe.tensor_map<buffer = {{[0-9]+}}, element_bytes = 1, rows = 1280, cols = 256, box_rows = 128, box_cols = 128>
// CHECK-SAME: shared_bytes = 216576
// CHECK: gpu.func @moe_grouped_matmul
// The consumers take a stage's row and weight-block scales from shared
// memory, where the producer warpgroup staged them with the stage.
// CHECK: memref.load {{.*}} : memref<4x1x160xf32, #gpu.address_space<workgroup>>
// The two consumer warpgroups take turns to issue (named barriers 4 and 5),
// so one promotes while the other's wgmma run.
// CHECK: "bar.sync $0, 256;"
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 32>, D[<f32>, <zero>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK: "bar.arrive $0, 256;"
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: math.fma
// CHECK: llvm.inline_asm has_side_effects
// CHECK: memref.store {{.*}} : memref<4x1x160xf32, #gpu.address_space<workgroup>>
// The producer warpgroup, which also stages the scales, keeps 40 registers
// (at 24 it spilled); the consumers take 232.
// PTX: .visible .entry moe_grouped_matmul(
// PTX-SAME: setmaxnreg.inc.sync.aligned.u32 \09232;
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3
// PTX-SAME: mbarrier.arrive.shared::cta.b64
// PTX-SAME: setmaxnreg.dec.sync.aligned.u32 \0940;
// PTX-SAME: cp.async.bulk.tensor.2d
func.func @block128(%x: tensor<?x256xf8E4M3FN>, %w13: tensor<4x320x256xf8E4M3FN>,
                    %counts: tensor<4xi32>, %offsets: tensor<5xi32>,
                    %sx: tensor<?x2xf32>, %sw: tensor<4x3x2xf32>)
    -> tensor<?x160xbf16> {
  %0 = moe.grouped_matmul %x, %w13 groups(%counts, %offsets) scales(%sx, %sw)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x256xf8E4M3FN>, tensor<4x320x256xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x2xf32>, tensor<4x3x2xf32>) -> tensor<?x160xbf16>
  return %0 : tensor<?x160xbf16>
}

// -----

// MXFP8: a scale per 32 of K and weight row. The wide tile loads 64 codes of
// K a stage (64-byte rows, 64-byte swizzle); the producer warpgroup stages
// each slot's weight-row scales (2 KiB a stage after the ring) and its rows'
// E8M0 codes (256 bytes a stage) and arrives on the slot's barrier with the
// TMA bytes. The consumers convert a stage into one of two bf16 stages
// (48 KiB each, before their 16 KiB epilogue buffers): masks and shifts of
// a word of four codes, two byte permutes that interleave them into bf16
// pairs, and a multiply by the block's power of two for two codes (one
// branch a stage picks one multiply or two); then both sync, and multiply
// it as bf16, the whole width a k-step: four stages fit.
// CHECK: #moe.tensor_map<buffer = 0, element_bytes = 1, rows = 1 * T, cols = 128, box_rows = 128, box_cols = 64>
// CHECK: shared_bytes = 223232
// CHECK: tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, epilogue = shared
// CHECK: gpu.func @moe_matmul
// CHECK: nvvm.prmt
// CHECK: fence.proxy.async.shared::cta
// CHECK: bar.sync 1, 256
// CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 256, k = 16>, D[<f32>, <one>]
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK-NEXT: bar.sync 1, 256
// PTX: .visible .entry moe_matmul(
// PTX: prmt.b32 {{[^;]*}}, 0x5140U;
// PTX-SAME: prmt.b32 {{[^;]*}}, 0x7362U;
// PTX: mul.rn.bf16x2
// PTX: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
func.func @mxfp8(%a: tensor<?x128xf8E4M3FN>, %b: tensor<96x128xf8E4M3FN>,
                 %sa: tensor<?x4xf8E8M0FNU>, %sb: tensor<96x4xf8E8M0FNU>)
    -> tensor<?x96xbf16> {
  %0 = moe.grouped_matmul %a, %b scales(%sa, %sb)
      : (tensor<?x128xf8E4M3FN>, tensor<96x128xf8E4M3FN>, tensor<?x4xf8E8M0FNU>,
         tensor<96x4xf8E8M0FNU>) -> tensor<?x96xbf16>
  return %0 : tensor<?x96xbf16>
}

// -----

// A bucket of few tokens takes the decode tile (swap_ab): the weights are
// wgmma's M side in 64-row boxes, an expert's rows its N (8 here, the
// rows' TMA box); a consumer warpgroup and a producer warp, a block per
// (row tile, column tile of 64 gate and 64 up rows).
// CHECK-LABEL: func.func @decode_gate_up
// CHECK-SAME: #moe.tensor_map<buffer = 6, element_bytes = 2, rows = 1 * T, cols = 64, box_rows = 8, box_cols = 64>, #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 2048, cols = 64, box_rows = 64, box_cols = 64>]
// CHECK-SAME: #moe.launch<kernel = @moe_grouped_matmul_1, work = 1, grid_y = 2, block = 160, shared_bytes = 35840,
// CHECK: gpu.func @moe_grouped_matmul_1({{.*}}) kernel attributes {known_block_size = array<i32: 160, 1, 1>
// PTX: .visible .entry moe_grouped_matmul_1(
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16
func.func @decode_gate_up(%x: tensor<?x64xbf16>, %w13: tensor<8x256x64xbf16>,
                          %counts: tensor<8xi32>, %offsets: tensor<9xi32>,
                          %bias: tensor<8x256xf32>) -> tensor<?x128xbf16>
    attributes {moe.token_buckets = array<i64: 1>} {
  %0 = moe.grouped_matmul %x, %w13 groups(%counts, %offsets) bias %bias
      {activation = #moe.activation<kind = clamped_swiglu>}
      : (tensor<?x64xbf16>, tensor<8x256x64xbf16>, tensor<8xi32>, tensor<9xi32>,
         tensor<8x256xf32>) -> tensor<?x128xbf16>
  return %0 : tensor<?x128xbf16>
}

// -----

// An FP8 decode tile that quantizes its output in blocks of 128: four
// fragments (128 gate and 128 up rows) a tile, each scale block's partial
// m64n8k32, and the block statistics meet across warps (a named barrier,
// its id an operand so a fused kernel can renumber it).
// CHECK-LABEL: func.func @decode_fp8
// CHECK-SAME: #moe.launch<kernel = @moe_grouped_matmul_1, work = 1, grid_y = 2, block = 160, shared_bytes = 68608,
// PTX: .visible .entry moe_grouped_matmul_1(
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3
// PTX-SAME: bar.sync %r{{[0-9]+}}, 128
func.func @decode_fp8(%x: tensor<?x256xf8E4M3FN>, %sx: tensor<?x2xf32>,
                      %b: tensor<4x512x256xf8E4M3FN>,
                      %sb: tensor<4x4x2xf32>, %c: tensor<4xi32>,
                      %o: tensor<5xi32>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
    attributes {moe.token_buckets = array<i64: 1>} {
  %0, %s = moe.grouped_matmul %x, %b groups(%c, %o) scales(%sx, %sb)
      {activation = #moe.activation<kind = swiglu>,
       out_quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xf8E4M3FN>, tensor<4x512x256xf8E4M3FN>,
         tensor<4xi32>, tensor<5xi32>, tensor<?x2xf32>,
         tensor<4x4x2xf32>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  return %0, %s : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
}
