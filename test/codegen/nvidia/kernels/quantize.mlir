// RUN: moe-opt %s -split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// Activations (a scale per row and 32 columns, MXFP8): a block of 128
// threads per row, 8 elements each, four lanes to a scale block, combined by
// shuffles. Dequantizing (here FP8 block-128 weights): a thread per 8 codes,
// 256 to a block of threads (4 x 256 x 256 / 8 = 32768 of them).
// CHECK-LABEL: func.func @rows
// CHECK: launches = [#moe.launch<kernel = @moe_quantize, work = 1 * T, block = 128, args = [buffer 0, buffer 3, buffer 4, tokens]>, #moe.launch<kernel = @moe_dequantize, work = 32768, per_block = 256, block = 256, args = [buffer 1, buffer 2, buffer 5, tokens]>]
// CHECK: gpu.func @moe_quantize(
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: gpu.func @moe_dequantize(
// CHECK: vector.load {{.*}} vector<8xi8>
// CHECK: vector.store {{.*}} vector<8xbf16>
// PTX: .visible .entry moe_quantize(
// PTX-SAME: .visible .entry moe_dequantize(
func.func @rows(%x: tensor<?x64xbf16>, %w: tensor<4x256x256xf8E4M3FN>,
                %ws: tensor<4x2x2xf32>)
    -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>, tensor<4x256x256xbf16>) {
  %data, %scales = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  %w16 = moe.dequantize %w, %ws {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x256x256xf8E4M3FN>, tensor<4x2x2xf32>) -> tensor<4x256x256xbf16>
  return %data, %scales, %w16
      : tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>, tensor<4x256x256xbf16>
}

// -----

// Weights a layer quantizes itself (training). MXFP8 [E, N, K]: the row
// kernel over E x N rows (4 x 64 = 256 blocks of threads). FP8 block-128: a
// block of 128 threads per 128 x 128 scale block (2 x 2 x 3 = 12, the last
// column block partial), the four warps' statistics meeting in shared memory.
// CHECK-LABEL: func.func @weights
// CHECK: launches = [#moe.launch<kernel = @moe_quantize, work = 256, block = 128, args = [buffer 0, buffer 2, buffer 3, tokens]>, #moe.launch<kernel = @moe_quantize_1, work = 12, block = 128, args = [buffer 1, buffer 4, buffer 5, tokens]>]
// CHECK: gpu.func @moe_quantize_1(
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: gpu.barrier
// CHECK: vector.store {{.*}} vector<8xi8>
// PTX: .visible .entry moe_quantize(
// PTX: .visible .entry moe_quantize_1(
// PTX: bar.sync
func.func @weights(%mx: tensor<4x64x256xbf16>, %fp8: tensor<2x256x320xbf16>)
    -> (tensor<4x64x256xf8E4M3FN>, tensor<4x64x8xf8E8M0FNU>,
        tensor<2x256x320xf8E4M3FN>, tensor<2x2x3xf32>) {
  %d0, %s0 = moe.quantize %mx {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<4x64x256xbf16>)
      -> (tensor<4x64x256xf8E4M3FN>, tensor<4x64x8xf8E8M0FNU>)
  %d1, %s1 = moe.quantize %fp8 {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<2x256x320xbf16>)
      -> (tensor<2x256x320xf8E4M3FN>, tensor<2x2x3xf32>)
  return %d0, %s0, %d1, %s1
      : tensor<4x64x256xf8E4M3FN>, tensor<4x64x8xf8E8M0FNU>,
        tensor<2x256x320xf8E4M3FN>, tensor<2x2x3xf32>
}

// -----

// A matrix's codes (shared experts' weights, rank 2): a thread per 8 of
// its 64 x 256 codes, 2048 in all.
// CHECK-LABEL: func.func @matrix
// CHECK: launches = [#moe.launch<kernel = @moe_dequantize, work = 2048, per_block = 256, block = 256,
func.func @matrix(%d: tensor<64x256xf8E4M3FN>, %s: tensor<64x8xf8E8M0FNU>)
    -> tensor<64x256xbf16> {
  %v = moe.dequantize %d, %s {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<64x256xf8E4M3FN>, tensor<64x8xf8E8M0FNU>) -> tensor<64x256xbf16>
  return %v : tensor<64x256xbf16>
}

// -----

// K not a multiple of 8 (no aligned 8-element accesses): one thread per
// scale block (T rows x 2 blocks), 128 to a block of threads.
// CHECK-LABEL: func.func @odd
// CHECK: launches = [#moe.launch<kernel = @moe_dequantize, work = 2 * T, per_block = 128, block = 128
func.func @odd(%d: tensor<?x36xf8E4M3FN>, %s: tensor<?x2xf8E8M0FNU>)
    -> tensor<?x36xbf16> {
  %v = moe.dequantize %d, %s {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x36xf8E4M3FN>, tensor<?x2xf8E8M0FNU>) -> tensor<?x36xbf16>
  return %v : tensor<?x36xbf16>
}
