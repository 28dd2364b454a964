// RUN: moe-opt %s --moe-legalize-scaled-matmul --split-input-file | FileCheck %s

// MXFP8 operands (E8M0 scales) are dequantized to bf16 for the matmul.
// CHECK-LABEL: func.func @mxfp8
// CHECK: %[[A:.+]] = moe.dequantize %arg0, %arg2 {scheme = #moe.quant<kind = mxfp8>} : (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>) -> tensor<?x64xbf16>
// CHECK: %[[B:.+]] = moe.dequantize %arg1, %arg3 {scheme = #moe.quant<kind = mxfp8>} : (tensor<4x32x64xf8E4M3FN>, tensor<4x32x2xf8E8M0FNU>) -> tensor<4x32x64xbf16>
// CHECK: moe.grouped_matmul %[[A]], %[[B]] groups(%arg4, %arg5) {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x16xbf16>
// CHECK-NOT: scales(
func.func @mxfp8(%a: tensor<?x64xf8E4M3FN>, %b: tensor<4x32x64xf8E4M3FN>,
                 %sa: tensor<?x2xf8E8M0FNU>, %sb: tensor<4x32x2xf8E8M0FNU>,
                 %counts: tensor<4xi32>, %offsets: tensor<5xi32>)
    -> tensor<?x16xbf16> {
  %0 = moe.grouped_matmul %a, %b groups(%counts, %offsets) scales(%sa, %sb)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xf8E4M3FN>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x2xf8E8M0FNU>, tensor<4x32x2xf8E8M0FNU>)
      -> tensor<?x16xbf16>
  return %0 : tensor<?x16xbf16>
}

// -----

// FP8 block-128 (f32 scales, 128 x 128 weight blocks) on a dense matmul.
// CHECK-LABEL: func.func @block128
// CHECK: moe.dequantize %arg0, %arg2 {scheme = #moe.quant<kind = fp8_block128>} : (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>) -> tensor<?x256xbf16>
// CHECK: moe.dequantize %arg1, %arg3 {scheme = #moe.quant<kind = fp8_block128>} : (tensor<320x256xf8E4M3FN>, tensor<3x2xf32>) -> tensor<320x256xbf16>
// CHECK: moe.grouped_matmul %{{[^ ,]+}}, %{{[^ ,]+}} : (tensor<?x256xbf16>, tensor<320x256xbf16>) -> tensor<?x320xbf16>
func.func @block128(%a: tensor<?x256xf8E4M3FN>, %b: tensor<320x256xf8E4M3FN>,
                    %sa: tensor<?x2xf32>, %sb: tensor<3x2xf32>)
    -> tensor<?x320xbf16> {
  %0 = moe.grouped_matmul %a, %b scales(%sa, %sb)
      : (tensor<?x256xf8E4M3FN>, tensor<320x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<3x2xf32>) -> tensor<?x320xbf16>
  return %0 : tensor<?x320xbf16>
}

// -----

// bf16 matmuls are left alone.
// CHECK-LABEL: func.func @bf16
// CHECK-NOT: moe.dequantize
// CHECK: moe.grouped_matmul
func.func @bf16(%a: tensor<?x64xbf16>, %b: tensor<32x64xbf16>)
    -> tensor<?x32xbf16> {
  %0 = moe.grouped_matmul %a, %b
      : (tensor<?x64xbf16>, tensor<32x64xbf16>) -> tensor<?x32xbf16>
  return %0 : tensor<?x32xbf16>
}
