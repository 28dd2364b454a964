// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @f(%x: tensor<2x?x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{hidden_states must have rank 2 (tokens x hidden), but has type 'tensor<2x?x8xbf16>'}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<2x?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x16xbf16>) {
  // expected-error @+1 {{router_weight dimension 1 (hidden) must be 8, but is 16}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x16xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %b: tensor<3xf32>) {
  // expected-error @+1 {{bias dimension 0 (experts) must be 4, but is 3}}
  %i, %w = moe.route %x, %rw bias %b {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<3xf32>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<5x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{expert_ids dimension 0 (tokens) must be 5, but is 6}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<5x8xbf16>, tensor<4x8xbf16>) -> (tensor<6x2xi32>, tensor<5x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{expert_ids dimension 1 (top-k) must be static}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x?xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{weights dimension 1 (top-k) must be 2, but is 3}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x3xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{top-k (5) must not exceed the number of experts (4)}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x5xi32>, tensor<?x5xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>) {
  // expected-error @+1 {{router n_group (3) must divide the number of experts (4)}}
  %i, %w = moe.route %x, %rw {router = #moe.router<kind = sigmoid_grouped_topk, n_group = 3>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{align must be at least 1, but is 0}}
  %d:4 = moe.dispatch %x, %ids {align = 0} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<3x8xbf16>, %ids: tensor<2x2xi32>) {
  // expected-error @+1 {{expert_ids dimension 0 (tokens) must be 3, but is 2}}
  %d:4 = moe.dispatch %x, %ids : (tensor<3x8xbf16>, tensor<2x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<3x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>, %s: tensor<?x1xf32>) {
  // expected-error @+1 {{scale dimension 1 (top-k) must be 2, but is 1}}
  %d:4 = moe.dispatch %x, %ids scale %s : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x1xf32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{dispatched dimension 1 (hidden) must be 8, but is 4}}
  %d:4 = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x4xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{tokens_per_expert dimension 0 (experts) must be static}}
  %d:4 = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{expert_offsets dimension 0 (experts + 1) must be 5, but is 4}}
  %d:4 = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<4xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{rows must have rank 2 (tokens x top-k), but has type 'tensor<?xi32>'}}
  %d:4 = moe.dispatch %x, %ids : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?xi32>)
  return
}

// -----

func.func @f(%x: tensor<bf16>) {
  // expected-error @+1 {{quantized data must have rank 1 or more}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>} : (tensor<bf16>) -> (tensor<f8E4M3FN>, tensor<f8E8M0FNU>)
  return
}

// -----

func.func @f(%x: tensor<?x64xbf16>) {
  // expected-error @+1 {{input shape [?, 64] differs from the quantized data's [?, 32]}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>) -> (tensor<?x32xf8E4M3FN>, tensor<?x1xf8E8M0FNU>)
  return
}

// -----

func.func @f(%x: tensor<4x?xbf16>) {
  // expected-error @+1 {{the quantized (last) dimension must be static and positive}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>} : (tensor<4x?xbf16>) -> (tensor<4x?xf8E4M3FN>, tensor<4x?xf8E8M0FNU>)
  return
}

// -----

func.func @f(%x: tensor<?x65xbf16>) {
  // expected-error @+1 {{scales must have shape [?, 3] for mxfp8 blocks of 32 along the last dimension of [?, 65], but has [?, 2]}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>} : (tensor<?x65xbf16>) -> (tensor<?x65xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  return
}

// -----

func.func @f(%x: tensor<?x128xbf16>) {
  // expected-error @+1 {{scales must hold 'f32' scales for fp8_block128, but holds 'f8E8M0FNU'}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>} : (tensor<?x128xbf16>) -> (tensor<?x128xf8E4M3FN>, tensor<?x1xf8E8M0FNU>)
  return
}

// -----

func.func @f(%d: tensor<2x32xf8E4M3FN>, %s: tensor<2x1xf8E8M0FNU>) {
  // expected-error @+1 {{output shape [2, 64] differs from the quantized data's [2, 32]}}
  %r = moe.dequantize %d, %s {scheme = #moe.quant<kind = mxfp8>} : (tensor<2x32xf8E4M3FN>, tensor<2x1xf8E8M0FNU>) -> tensor<2x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x?xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{lhs dimension 1 (K) must be static}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x?xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{rhs dimension 2 (K) must be 64, but is 32}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x64xbf16>, tensor<4x32x32xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{rhs dimension 1 (K) must be 64, but is 32}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) {transpose_rhs} : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %bias: tensor<4x32xbf16>) {
  // expected-error @+1 {{transpose_rhs takes bf16 operands without a bias or quantized result}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) bias %bias {transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<4x32xbf16>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{transpose_rhs takes an activation only as its backward (activation_input)}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) {activation = #moe.activation<kind = swiglu>, transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x16xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x64xbf16>) {
  // expected-error @+1 {{activation_input (an activation's backward epilogue) needs an activation}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x64xbf16>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x64xbf16>) {
  // expected-error @+1 {{activation_input (an activation's backward epilogue) takes bf16 weights read along N (transpose_rhs) or quantized ones transposed}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x64xbf16>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x32xbf16>) {
  // expected-error @+1 {{activation_input dimension 1 (2 N) must be 64, but is 32}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h {activation = #moe.activation<kind = swiglu>, transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x32xbf16>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x64xbf16>, %w: tensor<?xf32>) {
  // expected-error @+1 {{has 0 results beside `out`, but 1 are expected: the scales with out_quant, the row_dots with row_weights}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h row_weights %w {activation = #moe.activation<kind = swiglu>, transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x64xbf16>, tensor<?xf32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x100xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x200xbf16>, %w: tensor<?xf32>) {
  // expected-error @+1 {{row_dots dimension 1 (N / 64, rounded up) must be 2, but is 1}}
  %y, %d = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h row_weights %w {activation = #moe.activation<kind = swiglu>, transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x100xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x200xbf16>, tensor<?xf32>) -> (tensor<?x200xbf16>, tensor<?x1xf32>)
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x64x32xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %h: tensor<?x64xbf16>) {
  // expected-error @+1 {{is in_place, but activation_input is read after it}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) activation_input %h {activation = #moe.activation<kind = swiglu>, in_place, transpose_rhs} : (tensor<?x64xbf16>, tensor<4x64x32xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x64xbf16>) -> tensor<?x64xbf16>
  %z = moe.activation %h {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{in_place needs activation_input}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) {in_place} : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<3xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{tokens_per_expert dimension 0 (experts) must be 4, but is 3}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<3xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<4xi32>) {
  // expected-error @+1 {{expert_offsets dimension 0 (experts + 1) must be 5, but is 4}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<4xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>) {
  // expected-error @+1 {{rhs must have rank 2 (N x K), but has type 'tensor<4x32x64xbf16>'}}
  %y = moe.grouped_matmul %a, %b : (tensor<?x64xbf16>, tensor<4x32x64xbf16>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{lhs and rhs must have the same element type, but are 'bf16' and 'f8E4M3FN'}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x64xbf16>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xf8E4M3FN>, %b: tensor<4x32x64xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{f8E4M3FN operands need scales(lhs_scale, rhs_scale)}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) : (tensor<?x64xf8E4M3FN>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %as: tensor<?x2xf8E8M0FNU>, %bs: tensor<4x32x2xf8E8M0FNU>) {
  // expected-error @+1 {{scales are given for bf16 operands}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) scales(%as, %bs) : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xf8E8M0FNU>, tensor<4x32x2xf8E8M0FNU>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xf8E4M3FN>, %b: tensor<4x32x64xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>, %as: tensor<?x2xf8E8M0FNU>, %bs: tensor<4x32x1xf32>) {
  // expected-error @+1 {{lhs_scale and rhs_scale must use one scheme, but hold 'f8E8M0FNU' and 'f32'}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) scales(%as, %bs) : (tensor<?x64xf8E4M3FN>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xf8E8M0FNU>, tensor<4x32x1xf32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xf8E4M3FN>, %b: tensor<4x32x64xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>, %as: tensor<?x2xf32>, %bs: tensor<4x1x1xf32>) {
  // expected-error @+1 {{lhs_scale must have shape [?, 1] for fp8_block128 blocks of 128 along the last dimension of [?, 64], but has [?, 2]}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) scales(%as, %bs) : (tensor<?x64xf8E4M3FN>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xf32>, tensor<4x1x1xf32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xf8E4M3FN>, %b: tensor<4x32x64xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>, %as: tensor<?x2xf8E8M0FNU>, %bs: tensor<4x32x1xf8E8M0FNU>) {
  // expected-error @+1 {{rhs_scale must have shape [4, 32, 2] for mxfp8 blocks of 32 along the last dimension of [4, 32, 64], but has [4, 32, 1]}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) scales(%as, %bs) : (tensor<?x64xf8E4M3FN>, tensor<4x32x64xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xf8E8M0FNU>, tensor<4x32x1xf8E8M0FNU>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>, %bias: tensor<4x64xf32>) {
  // expected-error @+1 {{bias dimension 1 (N) must be 32, but is 64}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) bias %bias : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<4x64xf32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x33x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{a gated activation needs an even N (gate columns, then up columns), but N is 33}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<4x33x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x16xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{result dimension 1 (N) must be 16, but is 32}}
  %y = moe.grouped_matmul %a, %b groups(%c, %o) {activation = #moe.activation<kind = swiglu>} : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xbf16>, %b: tensor<4x32x64xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{tokens_per_expert and expert_offsets must be given together}}
  %y = "moe.grouped_matmul"(%a, %b, %c) <{operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0, 0, 0, 0, 0>}> : (tensor<?x64xbf16>, tensor<4x32x64xbf16>, tensor<4xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%a: tensor<?x64xf8E4M3FN>, %b: tensor<32x64xf8E4M3FN>, %s: tensor<?x2xf8E8M0FNU>) {
  // expected-error @+1 {{lhs_scale and rhs_scale must be given together}}
  %y = "moe.grouped_matmul"(%a, %b, %s) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 0, 0, 0, 0, 0>}> : (tensor<?x64xf8E4M3FN>, tensor<32x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%e: tensor<8xbf16>, %r: tensor<?x2xi32>) {
  // expected-error @+1 {{expert_out must have rank 2 (rows x hidden), but has type 'tensor<8xbf16>'}}
  %y = moe.combine %e, %r : (tensor<8xbf16>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<?x?xi32>) {
  // expected-error @+1 {{rows dimension 1 (top-k) must be static}}
  %y = moe.combine %e, %r : (tensor<?x8xbf16>, tensor<?x?xi32>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<?x2xi32>, %w: tensor<?x1xf32>) {
  // expected-error @+1 {{weights dimension 1 (top-k) must be 2, but is 1}}
  %y = moe.combine %e, %r weights %w : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x1xf32>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<?x2xi32>, %s: tensor<?x16xbf16>) {
  // expected-error @+1 {{shared dimension 1 (hidden) must be 8, but is 16}}
  %y = moe.combine %e, %r shared %s : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x16xbf16>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<?x2xi32>, %s: tensor<?x8xbf16>, %g: tensor<?x8xbf16>) {
  // expected-error @+1 {{gate dimension 1 (one gate) must be 1, but is 8}}
  %y = moe.combine %e, %r shared %s gate %g : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x8xbf16>, tensor<?x8xbf16>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<2x2xi32>) {
  // expected-error @+1 {{result dimension 0 (tokens) must be 2, but is 3}}
  %y = moe.combine %e, %r : (tensor<?x8xbf16>, tensor<2x2xi32>) -> tensor<3x8xbf16>
  return
}

// -----

func.func @f(%e: tensor<?x8xbf16>, %r: tensor<?x2xi32>, %g: tensor<?x1xbf16>) {
  // expected-error @+1 {{a gate needs the shared experts' output}}
  %y = "moe.combine"(%e, %r, %g) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 1>}> : (tensor<?x8xbf16>, tensor<?x2xi32>, tensor<?x1xbf16>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%q: tensor<?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>) {
  // expected-error @+1 {{query must have rank 4 (batch x query positions x query heads x head size), but has type 'tensor<?x8x64xbf16>'}}
  %o = moe.attention %q, %k, %v : (tensor<?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x32xbf16>, %v: tensor<1x?x2x32xbf16>) {
  // expected-error @+1 {{key dimension 3 (head size) must be 64, but is 32}}
  %o = moe.attention %q, %k, %v : (tensor<1x?x8x64xbf16>, tensor<1x?x2x32xbf16>, tensor<1x?x2x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<2x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>) {
  // expected-error @+1 {{key dimension 0 (batch) must be 1, but is 2}}
  %o = moe.attention %q, %k, %v : (tensor<1x?x8x64xbf16>, tensor<2x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x4x32xbf16>) {
  // expected-error @+1 {{value dimension 2 (key/value heads) must be 2, but is 4}}
  %o = moe.attention %q, %k, %v : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x4x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>) {
  // expected-error @+1 {{result dimension 3 (value head size) must be 32, but is 64}}
  %o = moe.attention %q, %k, %v : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> tensor<1x?x8x64xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x3x64xbf16>, %v: tensor<1x?x3x32xbf16>) {
  // expected-error @+1 {{query heads (8) must be a multiple of key/value heads (3)}}
  %o = moe.attention %q, %k, %v : (tensor<1x?x8x64xbf16>, tensor<1x?x3x64xbf16>, tensor<1x?x3x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%q: tensor<1x?x8x64xbf16>, %k: tensor<1x?x2x64xbf16>, %v: tensor<1x?x2x32xbf16>) {
  // expected-error @+1 {{scale must be a positive finite number}}
  %o = moe.attention %q, %k, %v {scale = -1.0 : f32} : (tensor<1x?x8x64xbf16>, tensor<1x?x2x64xbf16>, tensor<1x?x2x32xbf16>) -> tensor<1x?x8x32xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{local_experts must be at least 1, but is 0}}
  %s, %r = moe.ep_dispatch_send %x, %ids {local_experts = 0 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{rows dimension 1 (top-k) must be 2, but is 3}}
  %s, %r = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x3xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{has 0 quantized results, but tokens that travel quantized need 2 (codes and scales)}}
  %s, %r = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64, quant = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{tokens scales must have shape [?, 2] for mxfp8 blocks of 32 along the last dimension of [?, 64], but has [?, 3]}}
  %s, %r, %c, %sc = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64, quant = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>, tensor<?x64xf8E4M3FN>, tensor<?x3xf8E8M0FNU>)
  return
}

// -----

func.func @f(%sent: tensor<2xi32>) {
  // expected-error @+1 {{expert_offsets dimension 0 (local experts + 1) must be 3, but is 2}}
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<2xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%sent: tensor<2xi32>) {
  // expected-error @+1 {{origin dimension 1 (rank and row) must be 2, but is 1}}
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x1xi32>)
  return
}

// -----

func.func @f(%sent: tensor<2xi32>) {
  // expected-error @+1 {{dispatched is f8E4M3FN, which needs a quant scheme}}
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xf8E4M3FN>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%y: tensor<5x8xbf16>, %origin: tensor<4x2xi32>) {
  // expected-error @+1 {{origin dimension 0 (rows) must be 5, but is 4}}
  %s = moe.ep_combine_send %y, %origin : (tensor<5x8xbf16>, tensor<4x2xi32>) -> tensor<2xi32>
  return
}

// -----

func.func @f(%sent: tensor<2xi32>, %rows: tensor<3x2xi32>) {
  // expected-error @+1 {{gathered dimension 0 (tokens x top-k) must be 6, but is 5}}
  %g = moe.ep_combine_recv %sent, %rows : (tensor<2xi32>, tensor<3x2xi32>) -> tensor<5x8xbf16>
  return
}

// -----

func.func @f(%sent: tensor<2xi32>) {
  // expected-error @+1 {{gives its rows' weights, so its rows are neither scaled nor quantized}}
  %d, %c, %o, %origin, %w = moe.ep_dispatch_recv %sent {scaled, weights} : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x1xf32>)
  return
}

// -----

func.func @f(%sent: tensor<2xi32>) {
  // expected-error @+1 {{weights dimension 1 (one weight) must be 1, but is 2}}
  %d, %c, %o, %origin, %w = moe.ep_dispatch_recv %sent {weights} : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%y: tensor<4x8xbf16>, %origin: tensor<4x2xi32>, %v: tensor<5x1xf32>) {
  // expected-error @+1 {{values dimension 0 (rows) must be 4, but is 5}}
  %s = moe.ep_combine_send %y, %origin values %v : (tensor<4x8xbf16>, tensor<4x2xi32>, tensor<5x1xf32>) -> tensor<2xi32>
  return
}

// -----

func.func @f(%y: tensor<4x8xbf16>, %origin: tensor<4x2xi32>, %rows: tensor<3x2xi32>) {
  %s = moe.ep_combine_send %y, %origin : (tensor<4x8xbf16>, tensor<4x2xi32>) -> tensor<2xi32>
  // expected-error @+1 {{gives values its send did not carry}}
  %g, %v = moe.ep_combine_recv %s, %rows : (tensor<2xi32>, tensor<3x2xi32>) -> (tensor<6x8xbf16>, tensor<3x2xf32>)
  return
}

// -----

func.func @f(%g: tensor<?x8xbf16>, %h: tensor<?x16xbf16>, %gate: tensor<?x1xbf16>) {
  // expected-error @+1 {{has linear_gate but no f32 gate: the rows' weights themselves}}
  %dh, %aw, %dw = moe.activation_grad %g, %h gate %gate {activation = #moe.activation<kind = swiglu>, linear_gate} : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x1xbf16>) -> (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<?x1xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  // expected-error @+1 {{ep_size must be at least 1, but is 0}}
  %d, %c, %o, %r = moe.dispatch %x, %ids {ep_size = 0 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return
}

// -----

func.func @f(%x: tensor<?x100xbf16>) {
  // expected-error @+1 {{may change only the last dimension, but dimension 0 is ? and 4}}
  %p = moe.pad %x : tensor<?x100xbf16> -> tensor<4x104xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x100xbf16>) {
  // expected-error @+1 {{must extend a static last dimension: 100 becomes 96}}
  %p = moe.pad %x : tensor<?x100xbf16> -> tensor<?x96xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x100xbf16>) {
  // expected-error @+1 {{must keep the element type: 'bf16' becomes 'f32'}}
  %p = moe.pad %x : tensor<?x100xbf16> -> tensor<?x104xf32>
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<9xi32>) {
  // expected-error @+1 {{out dimension 1 (hidden) must be 64, but is 32}}
  %0 = moe.scatter %g, %rows offsets %off
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>) -> tensor<?x32xbf16>
  return
}

// -----

func.func @f(%g: tensor<8x64xbf16>, %rows: tensor<4x2xi32>, %off: tensor<9xi32>) {
  // expected-error @+1 {{rows dimension 0 (tokens) must be 8, but is 4}}
  %0 = moe.scatter %g, %rows offsets %off
      : (tensor<8x64xbf16>, tensor<4x2xi32>, tensor<9xi32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<1xi32>) {
  // expected-error @+1 {{has expert_offsets of 1 entries: one an expert and one more}}
  %0 = moe.scatter %g, %rows offsets %off
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<1xi32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<9xi32>, %w: tensor<?x4xf32>) {
  // expected-error @+1 {{scale dimension 1 (top-k) must be 2, but is 4}}
  %0 = moe.scatter %g, %rows offsets %off scale %w
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>, tensor<?x4xf32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<9xi32>, %w: tensor<?x2xf32>) {
  // expected-error @+1 {{weights and the row_weights result go together}}
  %0 = moe.scatter %g, %rows offsets %off weights %w
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>, tensor<?x2xf32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<9xi32>, %w: tensor<?x2xf32>) {
  // expected-error @+1 {{takes scale or weights, not both}}
  %0, %rw = moe.scatter %g, %rows offsets %off scale %w weights %w
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>, tensor<?x2xf32>, tensor<?x2xf32>) -> (tensor<?x64xbf16>, tensor<?xf32>)
  return
}

// -----

func.func @f(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %off: tensor<9xi32>) {
  // expected-error @+1 {{align must be at least 1, but is 0}}
  %0 = moe.scatter %g, %rows offsets %off {align = 0}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>) -> tensor<?x64xbf16>
  return
}

// -----

func.func @f(%w: tensor<4x64x32xbf16>) {
  // expected-error @+1 {{must give 'tensor<4x32x64xbf16>', not 'tensor<4x64x32xbf16>'}}
  %t = moe.transpose %w : tensor<4x64x32xbf16> -> tensor<4x64x32xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x32xbf16>) {
  // expected-error @+1 {{swaps static dimensions only}}
  %t = moe.transpose %x : tensor<?x32xbf16> -> tensor<32x?xbf16>
  return
}

// -----

func.func @f(%w: tensor<64x32xbf16>) {
  // expected-error @+1 {{must keep the element type: 'bf16' becomes 'f32'}}
  %t = moe.transpose %w : tensor<64x32xbf16> -> tensor<32x64xf32>
  return
}

// -----

func.func @f(%h: tensor<?x15xbf16>) {
  // expected-error @+1 {{a gated activation needs an even N (gate columns, then up columns), but N is 15}}
  %a = moe.activation %h {activation = #moe.activation<kind = swiglu>} : (tensor<?x15xbf16>) -> tensor<?x7xbf16>
  return
}

// -----

func.func @f(%h: tensor<?x512xbf16>) {
  // expected-error @+1 {{out is f8E4M3FN, which needs a quant scheme}}
  %a = moe.activation %h {activation = #moe.activation<kind = swiglu>} : (tensor<?x512xbf16>) -> tensor<?x256xf8E4M3FN>
  return
}

// -----

func.func @f(%h: tensor<?x512xbf16>) {
  // expected-error @+1 {{quantizes out, but has no result for its scales}}
  %a = moe.activation %h {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = fp8_block128>} : (tensor<?x512xbf16>) -> tensor<?x256xf8E4M3FN>
  return
}

// -----

func.func @f(%h: tensor<?x512xbf16>) {
  // expected-error @+1 {{out scales must have shape [?, 2] for fp8_block128 blocks of 128 along the last dimension of [?, 256], but has [?, 3]}}
  %a, %s = moe.activation %h {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = fp8_block128>} : (tensor<?x512xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x3xf32>)
  return
}

// -----

func.func @f(%h: tensor<?x512xbf16>, %w: tensor<?xf32>) {
  // expected-error @+1 {{quantizes a weighted activation, which only a backward's bf16 weight gradient reads}}
  %a, %s = moe.activation %h row_weights %w {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = fp8_block128>} : (tensor<?x512xbf16>, tensor<?xf32>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%h: tensor<7x16xbf16>, %w: tensor<6xf32>) {
  // expected-error @+1 {{row_weights dimension 0 (rows) must be 7, but is 6}}
  %a = moe.activation %h row_weights %w {activation = #moe.activation<kind = swiglu>} : (tensor<7x16xbf16>, tensor<6xf32>) -> tensor<7x8xbf16>
  return
}

// -----

func.func @f(%g: tensor<?x8xbf16>, %h: tensor<?x16xbf16>, %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>, %gate: tensor<?x1xbf16>) {
  // expected-error @+1 {{takes a row's weight from rows(rows, weights) or from a gate, not both}}
  %dh, %aw, %dw = moe.activation_grad %g, %h rows(%rows, %w) gate %gate {activation = #moe.activation<kind = swiglu>} : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x1xbf16>) -> (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<?x2xf32>)
  return
}

// -----

func.func @f(%g: tensor<?x8xbf16>, %h: tensor<?x16xbf16>, %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  // expected-error @+1 {{gives its weights' gradient as a third result}}
  %dh, %aw = moe.activation_grad %g, %h rows(%rows, %w) {activation = #moe.activation<kind = swiglu>} : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> (tensor<?x16xbf16>, tensor<?x8xbf16>)
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %w2: tensor<4x8x8xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{rhs dimension 1 (N) must be 16, but is 8}}
  %d = moe.grouped_matmul_dgrad %dy, %w2 groups(%c, %o) : (tensor<?x16xbf16>, tensor<4x8x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %w2: tensor<4x16x8xbf16>, %c: tensor<4xi32>) {
  // expected-error @+1 {{tokens_per_expert and expert_offsets must be given together}}
  %d = "moe.grouped_matmul_dgrad"(%dy, %w2, %c) {operandSegmentSizes = array<i32: 1, 1, 1, 0, 0, 0>} : (tensor<?x16xbf16>, tensor<4x16x8xbf16>, tensor<4xi32>) -> tensor<?x8xbf16>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{multiplies E4M3 codes without quant and lhs_scale}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) : (tensor<?x16xbf16>, tensor<?x8xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x16x8xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xbf16>, %s: tensor<?x1xf32>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{has lhs_scale but no quant}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) scale %s : (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x1xf32>) -> tensor<4x16x8xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{a quantized weight gradient takes fp8_block128}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) {quant = #moe.quant<kind = mxfp8>} : (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x16x8xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?xf32>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{has quant but no matrix lhs}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) {quant = #moe.quant<kind = fp8_block128>} : (tensor<?x16xbf16>, tensor<?xf32>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xf8E4M3FN>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{has E4M3 codes as lhs but no lhs_scale}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) {quant = #moe.quant<kind = fp8_block128>} : (tensor<?x16xbf16>, tensor<?x8xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x16x8xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xf8E4M3FN>, %s: tensor<?x2xf32>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{lhs_scale dimension 1 (the 128-column blocks of K) must be 1, but is 2}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) scale %s {quant = #moe.quant<kind = fp8_block128>} : (tensor<?x16xbf16>, tensor<?x8xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xf32>) -> tensor<4x16x8xf32>
  return
}

// -----

func.func @f(%dy: tensor<?x16xbf16>, %x: tensor<?x8xbf16>, %c: tensor<4xi32>, %o: tensor<5xi32>) {
  // expected-error @+1 {{result dimension 2 (K) must be 8, but is 4}}
  %d = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o) : (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x16x4xf32>
  return
}

// -----

func.func @f(%v: tensor<?x16xbf16>, %x: tensor<?x8xbf16>, %rows: tensor<?x2xi32>) {
  // expected-error @+1 {{row_values dimension 1 (hidden) must be 8, but is 16}}
  %d = moe.gather_dot %v, %x rows %rows : (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<?x2xf32>
  return
}

// -----

func.func @f(%v: tensor<?x4xf32>, %rows: tensor<?x2xi32>) {
  // expected-error @+1 {{result dimension 1 (top-k) must be 2, but is 3}}
  %d = moe.gather_dot %v rows %rows : (tensor<?x4xf32>, tensor<?x2xi32>) -> tensor<?x3xf32>
  return
}

// -----

func.func @f(%v: tensor<?x16xbf16>, %x: tensor<?x16xbf16>) {
  // expected-error @+1 {{dots rows with tokens, which needs `rows` to say which token each choice's row is}}
  %d = moe.gather_dot %v, %x : (tensor<?x16xbf16>, tensor<?x16xbf16>) -> tensor<?x1xf32>
  return
}

// -----

func.func @f(%v: tensor<?x4xf32>) {
  // expected-error @+1 {{result dimension 1 (one sum) must be 1, but is 2}}
  %d = moe.gather_dot %v : (tensor<?x4xf32>) -> tensor<?x2xf32>
  return
}

// -----

func.func @f(%h: tensor<?x512xbf16>, %w: tensor<?x2xf32>) {
  // expected-error @+1 {{row_weights dimension 1 (one value) must be 1, but is 2}}
  %a = moe.activation %h row_weights %w {activation = #moe.activation<kind = swiglu>} : (tensor<?x512xbf16>, tensor<?x2xf32>) -> tensor<?x256xbf16>
  return
}

// -----

func.func @f(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>, %logits: tensor<?x8xf32>, %ids: tensor<?x2xi32>, %dw: tensor<?x2xf32>) {
  // expected-error @+1 {{logits dimension 1 (experts) must be 4, but is 8}}
  %d = moe.route_grad %x, %wr logits %logits choices(%ids, %dw) {router = #moe.router<kind = softmax_topk>} : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<?x8xf32>, tensor<?x2xi32>, tensor<?x2xf32>) -> tensor<?x4xf32>
  return
}

// -----

func.func @f(%w: tensor<4x32x64xbf16>) {
  // expected-error @+1 {{transposed input shape [4, 64, 32] differs from the quantized data's [4, 32, 64]}}
  %d, %s = moe.quantize %w {scheme = #moe.quant<kind = fp8_block128>, transpose} : (tensor<4x32x64xbf16>) -> (tensor<4x32x64xf8E4M3FN>, tensor<4x1x1xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x64xbf16>) {
  // expected-error @+1 {{transpose swaps the last two dimensions of the input, which must be static (input shape [?, 64])}}
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>, transpose} : (tensor<?x64xbf16>) -> (tensor<64x?xf8E4M3FN>, tensor<1x?xf32>)
  return
}

// -----

func.func @f(%w: tensor<4x256x128xbf16>) {
  // expected-error @+1 {{gives the transpose's codes and scales (two results) only for 128 x 128 blocks of static last dimensions, without transpose}}
  %q, %s, %qt, %st = moe.quantize %w {scheme = #moe.quant<kind = fp8_block128>} : (tensor<4x256x128xbf16>) -> (tensor<4x256x128xf8E4M3FN>, tensor<4x256x1xf32>, tensor<4x128x256xf8E4M3FN>, tensor<4x128x2xf32>)
  return
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  // expected-error @+1 {{gives its rows' weights, which its send did not carry (it has no scale)}}
  %d, %c, %o, %origin, %w = moe.ep_dispatch_recv %sent {weights} : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x1xf32>)
  return
}
