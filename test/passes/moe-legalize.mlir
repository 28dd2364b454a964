// RUN: moe-opt %s -split-input-file -moe-decompose -moe-fuse-quantization -moe-legalize -verify-diagnostics | FileCheck %s

// H = 100 in bf16: gate/up's K is 200 bytes a row, not a whole number of
// TMA's 16-byte units. Its input rows and weights get zero columns up to
// K = 104 (the down matmul's K, the intermediate 64, is fine as it is).
// CHECK-LABEL: func @hidden_100
// CHECK: %[[D:.*]], %{{.*}}, %{{.*}}, %{{.*}} = moe.dispatch
// CHECK: %[[X:.*]] = moe.pad %[[D]] : tensor<?x100xbf16> -> tensor<?x104xbf16>
// CHECK: %[[W:.*]] = moe.pad %arg2 : tensor<4x128x100xbf16> -> tensor<4x128x104xbf16>
// CHECK: moe.grouped_matmul %[[X]], %[[W]] groups
// CHECK-NOT: moe.pad
// CHECK: moe.combine
func.func @hidden_100(%x: tensor<?x100xbf16>, %rw: tensor<4x100xbf16>, %w13: tensor<4x128x100xbf16>, %w2: tensor<4x100x64xbf16>) -> tensor<?x100xbf16> {
  // expected-remark @below {{K = 100 (gate_up matmul) padded with zeros to 104: sm_90a loads matmul operands with TMA, whose rows must be a multiple of 16 bytes; each call copies 102400 bytes of weights and 208 bytes per row of its input}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 100, intermediate = 64, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x100xbf16>, tensor<4x100xbf16>, tensor<4x128x100xbf16>, tensor<4x100x64xbf16>) -> tensor<?x100xbf16>
  return %0 : tensor<?x100xbf16>
}

// -----

// I = 40 in FP8 (MXFP8): the down matmul's K is 40 one-byte codes; codes
// and weights get zero columns up to 48, and the scales stay as they are
// (ceil(48 / 32) = ceil(40 / 32) blocks).
// CHECK-LABEL: func @intermediate_40_mxfp8
// CHECK: %[[H:.*]], %[[HS:.*]] = moe.grouped_matmul
// CHECK: %[[C:.*]] = moe.pad %[[H]] : tensor<?x40xf8E4M3FN> -> tensor<?x48xf8E4M3FN>
// CHECK: %[[W:.*]] = moe.pad %{{.*}} : tensor<4x64x40xf8E4M3FN> -> tensor<4x64x48xf8E4M3FN>
// CHECK: moe.grouped_matmul %[[C]], %[[W]] groups({{.*}}) scales(%[[HS]], %{{.*}})
func.func @intermediate_40_mxfp8(%x: tensor<?x64xbf16>, %rw: tensor<4x64xbf16>, %w13: tensor<4x80x64xbf16>, %w2: tensor<4x64x40xbf16>) -> tensor<?x64xbf16> {
  // expected-remark @below {{K = 40 (down matmul) padded with zeros to 48}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 64, intermediate = 40, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = mxfp8>>}
      : (tensor<?x64xbf16>, tensor<4x64xbf16>, tensor<4x80x64xbf16>, tensor<4x64x40xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// Shapes the kernels take are left alone.
// CHECK-LABEL: func @fine
// CHECK-NOT: moe.pad
func.func @fine(%x: tensor<?x64xbf16>, %rw: tensor<4x64xbf16>, %w13: tensor<4x128x64xbf16>, %w2: tensor<4x64x64xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 64, intermediate = 64, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x64xbf16>, tensor<4x64xbf16>, tensor<4x128x64xbf16>, tensor<4x64x64xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// A dgrad of bf16 operands becomes the matmul reading its weights as they
// lie (transpose_rhs), with a bf16 or an f32 result; one with an f32
// accumulator stays as it is.
// CHECK-LABEL: func @dgrad
// CHECK-NOT: moe.transpose
// CHECK: moe.grouped_matmul %arg0, %arg1 groups(%arg2, %arg3) {transpose_rhs} : {{.*}} -> tensor<?x32xbf16>
// CHECK: moe.grouped_matmul_dgrad %arg0, %arg1 groups(%arg2, %arg3) acc
// CHECK: moe.grouped_matmul %arg0, %arg1 groups(%arg2, %arg3) {transpose_rhs} : {{.*}} -> tensor<?x32xf32>
func.func @dgrad(%dy: tensor<?x64xbf16>, %w: tensor<4x64x32xbf16>, %counts: tensor<4xi32>, %offsets: tensor<5xi32>, %acc: tensor<?x32xf32>) -> (tensor<?x32xbf16>, tensor<?x32xf32>, tensor<?x32xf32>) {
  %0 = moe.grouped_matmul_dgrad %dy, %w groups(%counts, %offsets) : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  %1 = moe.grouped_matmul_dgrad %dy, %w groups(%counts, %offsets) acc %acc : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x32xf32>) -> tensor<?x32xf32>
  %2 = moe.grouped_matmul_dgrad %dy, %w groups(%counts, %offsets) : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xf32>
  return %0, %1, %2 : tensor<?x32xbf16>, tensor<?x32xf32>, tensor<?x32xf32>
}

// -----

// Weights whose rows TMA cannot read in whole 16-byte units (H = 100): the
// matmul takes a transposed copy, padded like any other K.
// CHECK-LABEL: func @dgrad_hidden_100
// CHECK: %[[WT:.*]] = moe.transpose %arg1 : tensor<4x100x32xbf16> -> tensor<4x32x100xbf16>
// CHECK: %[[X:.*]] = moe.pad %arg0 : tensor<?x100xbf16> -> tensor<?x104xbf16>
// CHECK: %[[W:.*]] = moe.pad %[[WT]] : tensor<4x32x100xbf16> -> tensor<4x32x104xbf16>
// CHECK: moe.grouped_matmul %[[X]], %[[W]] groups(%arg2, %arg3) : {{.*}} -> tensor<?x32xbf16>
func.func @dgrad_hidden_100(%dy: tensor<?x100xbf16>, %w: tensor<4x100x32xbf16>, %counts: tensor<4xi32>, %offsets: tensor<5xi32>) -> tensor<?x32xbf16> {
  // expected-remark @below {{K = 100 padded with zeros to 104}}
  %0 = moe.grouped_matmul_dgrad %dy, %w groups(%counts, %offsets) : (tensor<?x100xbf16>, tensor<4x100x32xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return %0 : tensor<?x32xbf16>
}

// -----

// A dgrad with the forward's bias: its rows go to the matmul, and the op
// stays for its bias_dot alone.
// CHECK-LABEL: func @dgrad_bias
// CHECK: %[[ROWS:.*]] = moe.grouped_matmul %arg0, %arg1 groups(%arg2, %arg3) {transpose_rhs} : {{.*}} -> tensor<?x32xbf16>
// CHECK: %{{.*}}, %[[DOT:.*]] = moe.grouped_matmul_dgrad %arg0, %arg1 groups(%arg2, %arg3) bias %arg4
// CHECK: return %[[ROWS]], %[[DOT]]
func.func @dgrad_bias(%dy: tensor<?x64xbf16>, %w: tensor<4x64x32xbf16>, %counts: tensor<4xi32>, %offsets: tensor<5xi32>, %bias: tensor<4x64xbf16>) -> (tensor<?x32xbf16>, tensor<?x1xf32>) {
  %0, %1 = moe.grouped_matmul_dgrad %dy, %w groups(%counts, %offsets) bias %bias : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<4x64xbf16>) -> (tensor<?x32xbf16>, tensor<?x1xf32>)
  return %0, %1 : tensor<?x32xbf16>, tensor<?x1xf32>
}

// -----

// The down matmul's dgrad with the activation's backward, its one reader,
// as its epilogue: the scatter lays the routing weights out by row, the
// weighted activation and the weight gradient that reads it come first,
// and the gate/up gradient is written over the gate/up output. A bias's
// dot becomes the first partial's term.
// CHECK-LABEL: func @dgrad_activation_grad
// CHECK: %[[DY:.*]], %[[RW:.*]] = moe.scatter %arg0, %arg1 offsets %arg3 weights %arg2
// CHECK: %{{.*}}, %[[DOT:.*]] = moe.grouped_matmul_dgrad %[[DY]], %arg5 groups(%arg4, %arg3) bias %arg7
// CHECK-NEXT: %[[AW:.*]] = moe.activation %arg6 row_weights %[[RW]] {activation = #moe.activation<kind = swiglu>}
// CHECK-NEXT: %[[DW:.*]] = moe.grouped_matmul_wgrad %[[DY]] lhs %[[AW]]
// CHECK-NEXT: %[[DH:.*]], %[[DOTS:.*]] = moe.grouped_matmul %[[DY]], %arg5 groups(%arg4, %arg3) activation_input %arg6 row_weights %[[RW]] row_term %[[DOT]] {activation = #moe.activation<kind = swiglu>, in_place, transpose_rhs}
// CHECK-SAME: -> (tensor<?x128xbf16>, tensor<?x1xf32>)
// CHECK-NEXT: %[[G:.*]] = moe.gather_dot %[[DOTS]] rows %arg1
// CHECK-NOT: moe.activation_grad
// CHECK: return %[[DH]], %[[DW]], %[[G]]
func.func @dgrad_activation_grad(%g: tensor<?x32xbf16>, %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>, %offsets: tensor<5xi32>, %counts: tensor<4xi32>, %w2: tensor<4x32x64xbf16>, %h: tensor<?x128xbf16>, %bias: tensor<4x32xbf16>) -> (tensor<?x128xbf16>, tensor<4x32x64xbf16>, tensor<?x2xf32>) {
  %dy = moe.scatter %g, %rows offsets %offsets : (tensor<?x32xbf16>, tensor<?x2xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  %d, %dot = moe.grouped_matmul_dgrad %dy, %w2 groups(%counts, %offsets) bias %bias : (tensor<?x32xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<4x32xbf16>) -> (tensor<?x64xbf16>, tensor<?x1xf32>)
  %dh, %aw, %dw = moe.activation_grad %d, %h rows(%rows, %w) bias_term %dot {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x1xf32>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x2xf32>)
  %dw2 = moe.grouped_matmul_wgrad %dy lhs %aw groups(%counts, %offsets) : (tensor<?x32xbf16>, tensor<?x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x32x64xbf16>
  return %dh, %dw2, %dw : tensor<?x128xbf16>, tensor<4x32x64xbf16>, tensor<?x2xf32>
}

// -----

// Shared experts: no routing weights, no weight gradient, the same
// epilogue. A gate keeps the activation_grad (unfused), and so does a
// gate/up output read after it (not in place: here, returned).
// CHECK-LABEL: func @dgrad_activation_grad_shared
// CHECK: %[[DH:.*]] = moe.grouped_matmul %arg0, %arg1 activation_input %arg2 {activation = #moe.activation<kind = swiglu>, transpose_rhs}
// CHECK-SAME: -> tensor<?x128xbf16>
// CHECK: moe.grouped_matmul %arg0, %arg1 {{.*}}transpose_rhs
// CHECK: moe.activation_grad
func.func @dgrad_activation_grad_shared(%dy: tensor<?x32xbf16>, %w2: tensor<32x64xbf16>, %h: tensor<?x128xbf16>, %gate: tensor<?x1xbf16>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x128xbf16>) {
  %d = moe.grouped_matmul_dgrad %dy, %w2 : (tensor<?x32xbf16>, tensor<32x64xbf16>) -> tensor<?x64xbf16>
  %dh, %aw = moe.activation_grad %d, %h {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<?x128xbf16>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>)
  %d2 = moe.grouped_matmul_dgrad %dy, %w2 : (tensor<?x32xbf16>, tensor<32x64xbf16>) -> tensor<?x64xbf16>
  %dh2, %aw2, %dg = moe.activation_grad %d2, %h gate %gate {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x1xbf16>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x1xf32>)
  return %dh, %aw, %dh2, %h : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x128xbf16>
}

// -----

// An expert-parallel backward's rows come with their routing weights, an
// f32 linear gate [R, 1]: the same epilogue, which takes them as the rows'
// weights, and each row's weight gradient is the sum of its own partials.
// CHECK-LABEL: func @dgrad_activation_grad_row_gate
// CHECK: %[[AW:.*]] = moe.activation %arg4 row_weights %arg5 {activation = #moe.activation<kind = swiglu>}
// CHECK-NEXT: %[[DH:.*]], %[[DOTS:.*]] = moe.grouped_matmul %arg0, %arg1 groups(%arg2, %arg3) activation_input %arg4 row_weights %arg5 {activation = #moe.activation<kind = swiglu>, in_place, transpose_rhs}
// CHECK-NEXT: %[[G:.*]] = moe.gather_dot %[[DOTS]] : (tensor<?x1xf32>) -> tensor<?x1xf32>
// CHECK-NOT: moe.activation_grad
// CHECK: return %[[DH]], %[[AW]], %[[G]]
func.func @dgrad_activation_grad_row_gate(%dy: tensor<?x32xbf16>, %w2: tensor<4x32x64xbf16>, %counts: tensor<4xi32>, %offsets: tensor<5xi32>, %h: tensor<?x128xbf16>, %w: tensor<?x1xf32>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x1xf32>) {
  %d = moe.grouped_matmul_dgrad %dy, %w2 groups(%counts, %offsets) : (tensor<?x32xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x64xbf16>
  %dh, %aw, %dw = moe.activation_grad %d, %h gate %w {activation = #moe.activation<kind = swiglu>, linear_gate} : (tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x1xf32>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x1xf32>)
  return %dh, %aw, %dw : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x1xf32>
}

// -----

// An FP8 dgrad (moe-differentiate's: quantized rows times the weights
// transposed and quantized) takes the activation's backward as its
// epilogue as the bf16 one does, reading its weights as they lie; the
// transpose and the quantize of the weights become one pass.
// CHECK-LABEL: func @fp8_dgrad_activation_grad
// CHECK: %[[DY:.*]], %[[RW:.*]] = moe.scatter %arg0, %arg1 offsets %arg3 weights %arg2
// CHECK-NOT: moe.transpose
// CHECK: %[[WQ:.*]], %[[WS:.*]] = moe.quantize %arg5 {scheme = #moe.quant<kind = fp8_block128>, transpose} : (tensor<4x32x64xbf16>) -> (tensor<4x64x32xf8E4M3FN>, tensor<4x1x1xf32>)
// CHECK: %[[GQ:.*]], %[[GS:.*]] = moe.quantize %[[DY]]
// CHECK: %[[AW:.*]] = moe.activation %arg6 row_weights %[[RW]]
// CHECK-NEXT: %[[DW:.*]] = moe.grouped_matmul_wgrad %[[DY]] lhs %[[AW]]
// CHECK-NEXT: %[[DH:.*]], %[[DOTS:.*]] = moe.grouped_matmul %[[GQ]], %[[WQ]] groups(%arg4, %arg3) scales(%[[GS]], %[[WS]]) activation_input %arg6 row_weights %[[RW]] {activation = #moe.activation<kind = swiglu>, in_place}
// CHECK-NEXT: %[[G:.*]] = moe.gather_dot %[[DOTS]] rows %arg1
// CHECK-NOT: moe.activation_grad
// CHECK: return %[[DH]], %[[DW]], %[[G]]
func.func @fp8_dgrad_activation_grad(%g: tensor<?x32xbf16>, %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>, %offsets: tensor<5xi32>, %counts: tensor<4xi32>, %w2: tensor<4x32x64xbf16>, %h: tensor<?x128xbf16>) -> (tensor<?x128xbf16>, tensor<4x32x64xbf16>, tensor<?x2xf32>) {
  %dy = moe.scatter %g, %rows offsets %offsets : (tensor<?x32xbf16>, tensor<?x2xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  %t = moe.transpose %w2 : tensor<4x32x64xbf16> -> tensor<4x64x32xbf16>
  %wq, %ws = moe.quantize %t {scheme = #moe.quant<kind = fp8_block128>} : (tensor<4x64x32xbf16>) -> (tensor<4x64x32xf8E4M3FN>, tensor<4x1x1xf32>)
  %gq, %gs = moe.quantize %dy {scheme = #moe.quant<kind = fp8_block128>} : (tensor<?x32xbf16>) -> (tensor<?x32xf8E4M3FN>, tensor<?x1xf32>)
  %d = moe.grouped_matmul %gq, %wq groups(%counts, %offsets) scales(%gs, %ws) : (tensor<?x32xf8E4M3FN>, tensor<4x64x32xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x1xf32>, tensor<4x1x1xf32>) -> tensor<?x64xbf16>
  %dh, %aw, %dw = moe.activation_grad %d, %h rows(%rows, %w) {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<?x128xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> (tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x2xf32>)
  %dw2 = moe.grouped_matmul_wgrad %dy lhs %aw groups(%counts, %offsets) : (tensor<?x32xbf16>, tensor<?x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x32x64xbf16>
  return %dh, %dw2, %dw : tensor<?x128xbf16>, tensor<4x32x64xbf16>, tensor<?x2xf32>
}

// -----

// A training forward quantizes each weight for its own matmul and, for the
// backward's FP8 dgrad, transposed: one pass gives both.
// CHECK-LABEL: func @weights_both_ways
// CHECK-NOT: moe.transpose
// CHECK: %[[Q:.*]], %[[S:.*]], %[[T:.*]]:2 = moe.quantize %arg0 {scheme = #moe.quant<kind = fp8_block128>} : (tensor<4x256x128xbf16>) -> (tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>, tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>)
// CHECK-NOT: moe.quantize
// CHECK: return %[[Q]], %[[S]], %[[T]]#0, %[[T]]#1
func.func @weights_both_ways(%w: tensor<4x256x128xbf16>) -> (tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>, tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>) {
  %q, %s = moe.quantize %w {scheme = #moe.quant<kind = fp8_block128>} : (tensor<4x256x128xbf16>) -> (tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>)
  %t = moe.transpose %w : tensor<4x256x128xbf16> -> tensor<4x128x256xbf16>
  %qt, %st = moe.quantize %t {scheme = #moe.quant<kind = fp8_block128>} : (tensor<4x128x256xbf16>) -> (tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>)
  return %q, %s, %qt, %st : tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>, tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>
}
