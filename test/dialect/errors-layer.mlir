// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @f(%x: tensor<?x16xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{hidden_states dimension 1 (hidden) must be 8, but is 16}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{hidden_states must have rank 2 (tokens x hidden), but has type 'tensor<8xbf16>'}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<3x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<4x8xbf16> {
  // expected-error @+1 {{result dimension 0 (tokens) must be 3, but is 4}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<3x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<4x8xbf16>
  return %0 : tensor<4x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<5x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{router_weight dimension 0 (experts) must be 4, but is 5}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<5x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x?xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{router_weight dimension 1 (hidden) must be static}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x?xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %rb: tensor<8xf32>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{router_bias dimension 0 (experts) must be 4, but is 8}}
  %0 = moe.layer %x router(%rw, %rb) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<8xf32>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x8x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13 dimension 1 (gate and up rows) must be 16, but is 8}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x8x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x16xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w2 dimension 2 (intermediate) must be 8, but is 16}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x16xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13 dimension 0 (local experts) must be 2, but is 4}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<0x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13 dimension 0 (local experts) must be positive}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<0x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13 and w2 must have the same element type, but are 'bf16' and 'f8E4M3FN'}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf8E4M3FN>, %w2: tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{f8E4M3FN w13 and w2 need a quant scheme in the config}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf8E4M3FN>, tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf8E4M3FN>, %w2: tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{f8E4M3FN w13 and w2 need scales(w13_scale, w2_scale)}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = mxfp8>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf8E4M3FN>, tensor<4x8x8xf8E4M3FN>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf8E4M3FN>, %w2: tensor<4x8x8xf8E4M3FN>, %s13: tensor<4x16x1xf32>, %s2: tensor<4x8x1xf32>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13_scale must hold 'f8E8M0FNU' scales for mxfp8, but holds 'f32'}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = mxfp8>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf8E4M3FN>, tensor<4x8x8xf8E4M3FN>, tensor<4x16x1xf32>, tensor<4x8x1xf32>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf8E4M3FN>, %w2: tensor<4x8x8xf8E4M3FN>, %s13: tensor<4x1x1xf32>, %s2: tensor<4x8x2xf32>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w2_scale must have shape [4, 8, 1] or [4, 1, 1] (128 x 128 blocks) for fp8_block128 blocks of 128 along the last dimension of [4, 8, 8], but has [4, 8, 2]}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = fp8_block128>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf8E4M3FN>, tensor<4x8x8xf8E4M3FN>, tensor<4x1x1xf32>, tensor<4x8x2xf32>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %s13: tensor<4x16x1xf8E8M0FNU>, %s2: tensor<4x8x1xf8E8M0FNU>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13_scale and w2_scale are given, but w13 and w2 are 'bf16', not f8E4M3FN}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = mxfp8>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x16x1xf8E8M0FNU>, tensor<4x8x1xf8E8M0FNU>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %b13: tensor<4x8xbf16>, %b2: tensor<4x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13_bias dimension 1 (gate and up rows) must be 16, but is 8}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) biases(%b13, %b2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %b13: tensor<4x16xbf16>, %b2: tensor<8xf32>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w2_bias must have rank 2 (local experts x hidden), but has type 'tensor<8xf32>'}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) biases(%b13, %b2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x16xbf16>, tensor<8xf32>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{the config has shared experts (shared_intermediate = 4), but no shared(shared_w13, shared_w2) weights}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared expert weights are given, but the config has no shared experts (shared_intermediate = 0)}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<4x8xbf16>, %sw2: tensor<8x4xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared_w13 dimension 0 (shared gate and up rows) must be 8, but is 4}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x8xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared_w2 dimension 1 (shared intermediate) must be 4, but is 8}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{the config has shared_gate = true, but no shared gate weight is given}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4, shared_gate = true>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>, %sg: tensor<1x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{a shared gate weight is given, but the config has shared_gate = false}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2, %sg) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>, tensor<1x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>, %sg: tensor<2x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared_gate dimension 0 (one gate) must be 1, but is 2}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2, %sg) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4, shared_gate = true>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>, tensor<2x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %b13: tensor<4x16xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13_bias and w2_bias must be given together}}
  %0 = "moe.layer"(%x, %rw, %w13, %w2, %b13) <{config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0>}>
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x16xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf8E4M3FN>, %w2: tensor<4x8x8xf8E4M3FN>, %s2: tensor<4x8x1xf8E8M0FNU>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{w13_scale and w2_scale must be given together}}
  %0 = "moe.layer"(%x, %rw, %w13, %w2, %s2) <{config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = mxfp8>>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0>}>
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf8E4M3FN>, tensor<4x8x8xf8E4M3FN>, tensor<4x8x1xf8E8M0FNU>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw2: tensor<8x4xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared_w13 and shared_w2 must be given together}}
  %0 = "moe.layer"(%x, %rw, %w13, %w2, %sw2) <{config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0>}>
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{operand #2 must be ranked tensor of bfloat16 type or f8E4M3FN type values, but got 'tensor<4x16x8xf16>'}}
  %0 = "moe.layer"(%x, %rw, %w13, %w2) <{config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0>}>
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// The shared experts' FP8 weights need their own scales.
func.func @shared_fp8_without_scales(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
    %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>,
    %sw13: tensor<8x8xf8E4M3FN>, %sw2: tensor<8x4xf8E4M3FN>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{f8E4M3FN shared_w13 and shared_w2 need shared_scales(shared_w13_scale, shared_w2_scale)}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4, quant = <kind = mxfp8>>} : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xf8E4M3FN>, tensor<8x4xf8E4M3FN>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @shared_scale_shape(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
    %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>,
    %sw13: tensor<8x8xf8E4M3FN>, %sw2: tensor<8x4xf8E4M3FN>,
    %s13: tensor<8x2xf8E8M0FNU>, %s2: tensor<8x1xf8E8M0FNU>) -> tensor<?x8xbf16> {
  // expected-error @+1 {{shared_w13_scale must have shape [8, 1] for mxfp8 blocks of 32 along the last dimension of [8, 8], but has [8, 2]}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) shared_scales(%s13, %s2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4, quant = <kind = mxfp8>>} : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xf8E4M3FN>, tensor<8x4xf8E4M3FN>, tensor<8x2xf8E8M0FNU>, tensor<8x1xf8E8M0FNU>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

func.func @f(%x: tensor<3x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> (tensor<3x8xbf16>, tensor<3x5xf32>) {
  // expected-error @+1 {{router_logits dimension 1 (experts) must be 4, but is 5}}
  %0, %1 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<3x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> (tensor<3x8xbf16>, tensor<3x5xf32>)
  return %0, %1 : tensor<3x8xbf16>, tensor<3x5xf32>
}
