// RUN: moe-opt %s --moe-fuse-quantization --split-input-file --verify-diagnostics | FileCheck %s

// A quantized layer's activations: the dispatched rows are quantized by the
// dispatch, the gate/up matmul's result by its epilogue; no quantize is left.
// CHECK-LABEL: func.func @layer
// CHECK: %[[X:[^,]+]], %[[C:[^,]+]], %[[O:[^,]+]], %{{[^,]+}}, %[[XS:[^ ]+]] = moe.dispatch %arg0, %arg1 {quant = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>, tensor<?x2xi32>) -> (tensor<?x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>, tensor<?x2xf8E8M0FNU>)
// CHECK: %[[H:[^,]+]], %[[HS:[^ ]+]] = moe.grouped_matmul %[[X]], %arg2 groups(%[[C]], %[[O]]) scales(%[[XS]], %arg4) {activation = #moe.activation<kind = swiglu>, out_quant = #moe.quant<kind = mxfp8>} : ({{.*}}) -> (tensor<?x32xf8E4M3FN>, tensor<?x1xf8E8M0FNU>)
// CHECK: moe.grouped_matmul %[[H]], %arg3 groups(%[[C]], %[[O]]) scales(%[[HS]], %arg5) : ({{.*}}) -> tensor<?x64xbf16>
// CHECK-NOT: moe.quantize
func.func @layer(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>,
                 %w13: tensor<4x64x64xf8E4M3FN>, %w2: tensor<4x64x32xf8E4M3FN>,
                 %s13: tensor<4x64x2xf8E8M0FNU>, %s2: tensor<4x64x1xf8E8M0FNU>)
    -> tensor<?x64xbf16> {
  %d:4 = moe.dispatch %x, %ids : (tensor<?x64xbf16>, tensor<?x2xi32>)
      -> (tensor<?x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  %xq, %xs = moe.quantize %d#0 {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  %h = moe.grouped_matmul %xq, %w13 groups(%d#1, %d#2) scales(%xs, %s13)
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x64xf8E4M3FN>, tensor<4x64x64xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x2xf8E8M0FNU>, tensor<4x64x2xf8E8M0FNU>)
      -> tensor<?x32xbf16>
  %hq, %hs = moe.quantize %h {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x32xbf16>) -> (tensor<?x32xf8E4M3FN>, tensor<?x1xf8E8M0FNU>)
  %y = moe.grouped_matmul %hq, %w2 groups(%d#1, %d#2) scales(%hs, %s2)
      : (tensor<?x32xf8E4M3FN>, tensor<4x64x32xf8E4M3FN>, tensor<4xi32>,
         tensor<5xi32>, tensor<?x1xf8E8M0FNU>, tensor<4x64x1xf8E8M0FNU>)
      -> tensor<?x64xbf16>
  return %y : tensor<?x64xbf16>
}

// -----

// The tokens themselves, quantized for the shared experts with the scheme the
// dispatch quantizes its rows with: the dispatch gives them too, having each
// row's codes in hand.
// CHECK-LABEL: func.func @shared_input
// CHECK: %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[Q:.+]]:3 = moe.dispatch %arg0, %arg1 {quant = #moe.quant<kind = fp8_block128>} : (tensor<?x256xbf16>, tensor<?x2xi32>) -> (tensor<?x256xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
// CHECK-NOT: moe.quantize
// CHECK: return %[[Q]]#1, %[[Q]]#2
func.func @shared_input(%x: tensor<?x256xbf16>, %ids: tensor<?x2xi32>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x256xf8E4M3FN>) {
  %d:4 = moe.dispatch %x, %ids : (tensor<?x256xbf16>, tensor<?x2xi32>)
      -> (tensor<?x256xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  %dq, %ds = moe.quantize %d#0 {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  %xq, %xs = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  return %xq, %xs, %dq : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x256xf8E4M3FN>
}

// -----

// A result read by something else too stays unquantized, and its quantize
// stays a step of its own.
// CHECK-LABEL: func.func @shared_result
// CHECK: moe.grouped_matmul {{.*}} -> tensor<?x128xbf16>
// CHECK: moe.quantize
func.func @shared_result(%a: tensor<?x256xf8E4M3FN>, %b: tensor<128x256xf8E4M3FN>,
                         %sa: tensor<?x2xf32>, %sb: tensor<1x2xf32>)
    -> (tensor<?x128xbf16>, tensor<?x128xf8E4M3FN>) {
  %h = moe.grouped_matmul %a, %b scales(%sa, %sb)
      : (tensor<?x256xf8E4M3FN>, tensor<128x256xf8E4M3FN>, tensor<?x2xf32>,
         tensor<1x2xf32>) -> tensor<?x128xbf16>
  %q, %s = moe.quantize %h {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x128xbf16>) -> (tensor<?x128xf8E4M3FN>, tensor<?x1xf32>)
  return %h, %q : tensor<?x128xbf16>, tensor<?x128xf8E4M3FN>
}

// -----

// Dequantized operands of a matmul: the matmul takes the codes and scales.
// CHECK-LABEL: func.func @dequantized
// CHECK-NOT: moe.dequantize
// CHECK: moe.grouped_matmul %arg0, %arg1 scales(%arg2, %arg3) : (tensor<?x256xf8E4M3FN>, tensor<320x256xf8E4M3FN>, tensor<?x2xf32>, tensor<3x2xf32>) -> tensor<?x320xbf16>
func.func @dequantized(%a: tensor<?x256xf8E4M3FN>, %b: tensor<320x256xf8E4M3FN>,
                       %sa: tensor<?x2xf32>, %sb: tensor<3x2xf32>)
    -> tensor<?x320xbf16> {
  %x = moe.dequantize %a, %sa {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>) -> tensor<?x256xbf16>
  %w = moe.dequantize %b, %sb {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<320x256xf8E4M3FN>, tensor<3x2xf32>) -> tensor<320x256xbf16>
  %0 = moe.grouped_matmul %x, %w : (tensor<?x256xbf16>, tensor<320x256xbf16>)
      -> tensor<?x320xbf16>
  return %0 : tensor<?x320xbf16>
}

// -----

// Fused results must be E4M3 with their scales.
func.func @bad_fused(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{quantizes dispatched, but has no result for its scales}}
  %d:4 = moe.dispatch %x, %ids {quant = #moe.quant<kind = mxfp8>}
      : (tensor<?x64xbf16>, tensor<?x2xi32>)
      -> (tensor<?x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

// A training forward's activation (apart from the gate/up matmul, whose
// output is saved) quantizes for the down matmul itself; a weighted one (a
// backward's) or one read by something else too stays bf16.
// CHECK-LABEL: func.func @train_activation
// CHECK: %[[A:[^,]+]], %[[S:[^ ]+]] = moe.activation %arg0 {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = fp8_block128>} : (tensor<?x512xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
// CHECK: moe.activation %arg0 row_weights %arg1 {{.*}} -> tensor<?x256xbf16>
// CHECK: moe.quantize
// CHECK: return %[[A]], %[[S]]
func.func @train_activation(%h: tensor<?x512xbf16>, %w: tensor<?xf32>)
    -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>, tensor<?x256xf8E4M3FN>,
        tensor<?x2xf32>) {
  %a = moe.activation %h {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x512xbf16>) -> tensor<?x256xbf16>
  %aq, %as = moe.quantize %a {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  %b = moe.activation %h row_weights %w
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x512xbf16>, tensor<?xf32>) -> tensor<?x256xbf16>
  %bq, %bs = moe.quantize %b {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  return %aq, %as, %bq, %bs : tensor<?x256xf8E4M3FN>, tensor<?x2xf32>,
      tensor<?x256xf8E4M3FN>, tensor<?x2xf32>
}
