// RUN: moe-opt %s --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// Activations (a scale per row and 32 columns, MXFP8): a block of 128
// threads per row, 8 elements each, four lanes to a scale block, combined by
// shuffles. Other layouts (FP8 block-128 weights, one scale per 128 x 128
// block) a thread per scale block, 128 per block of threads.
// CHECK: launches = [#moe.launch<kernel = @moe_quantize, work = 1 * T, block = 128, args = [buffer 0, buffer 3, buffer 4, tokens]>, #moe.launch<kernel = @moe_dequantize, work = 16, per_block = 128, block = 128, args = [buffer 1, buffer 2, buffer 5, tokens]>]
// CHECK: gpu.func @moe_quantize(
// CHECK: gpu.shuffle  xor
// CHECK: gpu.shuffle  xor
// CHECK: gpu.func @moe_dequantize(
// PTX: .visible .entry moe_quantize(
// PTX-SAME: .visible .entry moe_dequantize(
func.func @blocks(%x: tensor<?x64xbf16>, %w: tensor<4x256x256xf8E4M3FN>,
                  %ws: tensor<4x2x2xf32>)
    -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>, tensor<4x256x256xbf16>) {
  %data, %scales = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  %w16 = moe.dequantize %w, %ws {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x256x256xf8E4M3FN>, tensor<4x2x2xf32>) -> tensor<4x256x256xbf16>
  return %data, %scales, %w16
      : tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>, tensor<4x256x256xbf16>
}
