// RUN: moe-opt %s -split-input-file -moe-decompose -verify-diagnostics | FileCheck %s

// Mixtral-style: softmax top-k, routed experts only.
// CHECK-LABEL: func @softmax_topk
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xbf16>, %[[RW:.*]]: tensor<4x8xbf16>, %[[W13:.*]]: tensor<4x16x8xbf16>, %[[W2:.*]]: tensor<4x8x8xbf16>)
// CHECK: %[[IDS:.*]], %[[WTS:.*]] = moe.route %[[X]], %[[RW]] {router = #moe.router<kind = softmax_topk, renormalize = true>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
// CHECK: %[[D:.*]], %[[C:.*]], %[[O:.*]], %[[ROWS:.*]] = moe.dispatch %[[X]], %[[IDS]] : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[D]], %[[W13]] groups(%[[C]], %[[O]]) {activation = #moe.activation<kind = swiglu>} : {{.*}} -> tensor<?x8xbf16>
// CHECK: %[[Y:.*]] = moe.grouped_matmul %[[H]], %[[W2]] groups(%[[C]], %[[O]]) : {{.*}} -> tensor<?x8xbf16>
// CHECK: %[[OUT:.*]] = moe.combine %[[Y]], %[[ROWS]] weights %[[WTS]] : {{.*}} -> tensor<?x8xbf16>
// CHECK: return %[[OUT]]
// CHECK-NOT: moe.layer
func.func @softmax_topk(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk, renormalize = true>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// DeepSeek-V3-style: grouped sigmoid router with a selection bias, a shared expert.
// CHECK-LABEL: func @sigmoid_grouped_shared
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xbf16>, %[[RW:.*]]: tensor<8x8xbf16>, %[[RB:.*]]: tensor<8xf32>, %[[W13:.*]]: tensor<8x16x8xbf16>, %[[W2:.*]]: tensor<8x8x8xbf16>, %[[SW13:.*]]: tensor<8x8xbf16>, %[[SW2:.*]]: tensor<8x4xbf16>)
// CHECK: %[[IDS:.*]], %[[WTS:.*]] = moe.route %[[X]], %[[RW]] bias %[[RB]] {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true, n_group = 4, topk_group = 2, scaling = 2.5>}
// CHECK: %[[D:.*]], %[[C:.*]], %[[O:.*]], %[[ROWS:.*]] = moe.dispatch %[[X]], %[[IDS]] :
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[D]], %[[W13]] groups(%[[C]], %[[O]])
// CHECK: %[[Y:.*]] = moe.grouped_matmul %[[H]], %[[W2]] groups(%[[C]], %[[O]])
// CHECK: %[[SH:.*]] = moe.grouped_matmul %[[X]], %[[SW13]] {activation = #moe.activation<kind = swiglu>} : (tensor<?x8xbf16>, tensor<8x8xbf16>) -> tensor<?x4xbf16>
// CHECK: %[[S:.*]] = moe.grouped_matmul %[[SH]], %[[SW2]] : (tensor<?x4xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
// CHECK: moe.combine %[[Y]], %[[ROWS]] weights %[[WTS]] shared %[[S]] :
func.func @sigmoid_grouped_shared(%x: tensor<?x8xbf16>, %rw: tensor<8x8xbf16>, %rb: tensor<8xf32>, %w13: tensor<8x16x8xbf16>, %w2: tensor<8x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw, %rb) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 8, top_k = 2, hidden = 8, intermediate = 8, router = <kind = sigmoid_grouped_topk, renormalize = true, n_group = 4, topk_group = 2, scaling = 2.5>, activation = <kind = swiglu>, shared_intermediate = 4>}
      : (tensor<?x8xbf16>, tensor<8x8xbf16>, tensor<8xf32>, tensor<8x16x8xbf16>, tensor<8x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// GPT-OSS-style: top-k then softmax, router bias, expert biases, clamped SwiGLU.
// CHECK-LABEL: func @gpt_oss
// CHECK-SAME: %[[B13:[^:]*]]: tensor<4x16xbf16>, %[[B2:[^:]*]]: tensor<4x8xbf16>)
// CHECK: moe.route %{{.*}}, %{{.*}} bias %{{.*}} {router = #moe.router<kind = topk_softmax>}
// CHECK: moe.grouped_matmul %{{.*}}, %{{.*}} groups(%{{.*}}, %{{.*}}) bias %[[B13]] {activation = #moe.activation<kind = clamped_swiglu>}
// CHECK: moe.grouped_matmul %{{.*}}, %{{.*}} groups(%{{.*}}, %{{.*}}) bias %[[B2]] :
// CHECK: moe.combine %{{.*}}, %{{.*}} weights %{{.*}} :
func.func @gpt_oss(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %rb: tensor<4xf32>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %b13: tensor<4x16xbf16>, %b2: tensor<4x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw, %rb) experts(%w13, %w2) biases(%b13, %b2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = topk_softmax>, activation = <kind = clamped_swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4xf32>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<4x16xbf16>, tensor<4x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// Llama-4-style: the router weight scales the expert input, so combine sums
// unweighted; the shared expert is added.
// CHECK-LABEL: func @sigmoid_scale_input
// CHECK: %[[IDS:.*]], %[[WTS:.*]] = moe.route
// CHECK: %{{.*}}, %{{.*}}, %{{.*}}, %[[ROWS:.*]] = moe.dispatch %{{.*}}, %[[IDS]] scale %[[WTS]] :
// CHECK: moe.combine %{{.*}}, %[[ROWS]] shared %{{.*}} : (tensor<?x8xbf16>, tensor<5x1xi32>, tensor<5x8xbf16>) -> tensor<5x8xbf16>
func.func @sigmoid_scale_input(%x: tensor<5x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<16x8xbf16>, %sw2: tensor<8x8xbf16>) -> tensor<5x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 1, hidden = 8, intermediate = 8, router = <kind = sigmoid_scale_input>, activation = <kind = swiglu>, shared_intermediate = 8>}
      : (tensor<5x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<16x8xbf16>, tensor<8x8xbf16>) -> tensor<5x8xbf16>
  return %0 : tensor<5x8xbf16>
}

// -----

// Qwen2-MoE-style: a shared expert scaled by a sigmoid gate, a dense N = 1
// matmul that stays in bf16.
// CHECK-LABEL: func @shared_gate
// CHECK-SAME: %[[SG:[^:]*]]: tensor<1x8xbf16>)
// CHECK: %[[S:.*]] = moe.grouped_matmul %{{.*}}, %{{.*}} : (tensor<?x4xbf16>, tensor<8x4xbf16>) -> tensor<?x8xbf16>
// CHECK: %[[G:.*]] = moe.grouped_matmul %{{.*}}, %[[SG]] : (tensor<?x8xbf16>, tensor<1x8xbf16>) -> tensor<?x1xbf16>
// CHECK: moe.combine %{{.*}}, %{{.*}} weights %{{.*}} shared %[[S]] gate %[[G]] :
func.func @shared_gate(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>, %sw13: tensor<8x8xbf16>, %sw2: tensor<8x4xbf16>, %sg: tensor<1x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2, %sg) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 4, shared_gate = true>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>, tensor<8x8xbf16>, tensor<8x4xbf16>, tensor<1x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// MXFP8 with bf16 weights: activations and weights are quantized right before
// each matmul, 32-element blocks with E8M0 scales; the shared expert too.
// CHECK-LABEL: func @mxfp8
// CHECK-SAME: (%[[X:.*]]: tensor<?x64xbf16>, %{{.*}}: tensor<4x64xbf16>, %[[W13:.*]]: tensor<4x96x64xbf16>, %[[W2:.*]]: tensor<4x64x48xbf16>
// CHECK: %[[D:.*]], %[[C:.*]], %[[O:.*]], %{{.*}} = moe.dispatch
// CHECK: %[[DQ:.*]], %[[DS:.*]] = moe.quantize %[[D]] {scheme = #moe.quant<kind = mxfp8, rounding = ceil>} : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
// CHECK: %[[W13Q:.*]], %[[W13S:.*]] = moe.quantize %[[W13]] {{.*}} : (tensor<4x96x64xbf16>) -> (tensor<4x96x64xf8E4M3FN>, tensor<4x96x2xf8E8M0FNU>)
// CHECK: %[[H:.*]] = moe.grouped_matmul %[[DQ]], %[[W13Q]] groups(%[[C]], %[[O]]) scales(%[[DS]], %[[W13S]]) {activation = #moe.activation<kind = swiglu>} : {{.*}} -> tensor<?x48xbf16>
// CHECK: %[[HQ:.*]], %[[HS:.*]] = moe.quantize %[[H]] {{.*}} : (tensor<?x48xbf16>) -> (tensor<?x48xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
// CHECK: %[[W2Q:.*]], %[[W2S:.*]] = moe.quantize %[[W2]] {{.*}} : (tensor<4x64x48xbf16>) -> (tensor<4x64x48xf8E4M3FN>, tensor<4x64x2xf8E8M0FNU>)
// CHECK: moe.grouped_matmul %[[HQ]], %[[W2Q]] groups(%[[C]], %[[O]]) scales(%[[HS]], %[[W2S]]) :
// CHECK: moe.quantize %[[X]]
// CHECK: moe.combine
func.func @mxfp8(%x: tensor<?x64xbf16>, %rw: tensor<4x64xbf16>, %w13: tensor<4x96x64xbf16>, %w2: tensor<4x64x48xbf16>, %sw13: tensor<32x64xbf16>, %sw2: tensor<64x16xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) shared(%sw13, %sw2) {config = #moe.config<experts = 4, top_k = 2, hidden = 64, intermediate = 48, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = 16, quant = <kind = mxfp8, rounding = ceil>>}
      : (tensor<?x64xbf16>, tensor<4x64xbf16>, tensor<4x96x64xbf16>, tensor<4x64x48xbf16>, tensor<32x64xbf16>, tensor<64x16xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// -----

// FP8 block-128 with weights stored quantized (as DeepSeek-V3 ships them):
// their scales are used as given; only activations are quantized, 1 x 128.
// CHECK-LABEL: func @fp8_block128_prequantized
// CHECK-SAME: %[[W13:[^:]*]]: tensor<2x512x256xf8E4M3FN>, %[[W2:[^:]*]]: tensor<2x256x256xf8E4M3FN>, %[[S13:[^:]*]]: tensor<2x4x2xf32>, %[[S2:[^:]*]]: tensor<2x2x2xf32>)
// CHECK: %[[DQ:.*]], %[[DS:.*]] = moe.quantize %{{.*}} {scheme = #moe.quant<kind = fp8_block128>} : (tensor<?x256xbf16>) -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
// CHECK-NEXT: %[[H:.*]] = moe.grouped_matmul %[[DQ]], %[[W13]] groups(%{{.*}}, %{{.*}}) scales(%[[DS]], %[[S13]])
// CHECK-NEXT: %[[HQ:.*]], %[[HS:.*]] = moe.quantize %[[H]]
// CHECK-NEXT: moe.grouped_matmul %[[HQ]], %[[W2]] groups(%{{.*}}, %{{.*}}) scales(%[[HS]], %[[S2]])
func.func @fp8_block128_prequantized(%x: tensor<?x256xbf16>, %rw: tensor<2x256xbf16>, %w13: tensor<2x512x256xf8E4M3FN>, %w2: tensor<2x256x256xf8E4M3FN>, %s13: tensor<2x4x2xf32>, %s2: tensor<2x2x2xf32>) -> tensor<?x256xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2) {config = #moe.config<experts = 2, top_k = 1, hidden = 256, intermediate = 256, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = fp8_block128>>}
      : (tensor<?x256xbf16>, tensor<2x256xbf16>, tensor<2x512x256xf8E4M3FN>, tensor<2x256x256xf8E4M3FN>, tensor<2x4x2xf32>, tensor<2x2x2xf32>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

// FP8 block-128 with bf16 weights: weights are quantized in 128 x 128 blocks.
// CHECK-LABEL: func @fp8_block128_bf16_weights
// CHECK: moe.quantize %{{.*}} : (tensor<2x512x256xbf16>) -> (tensor<2x512x256xf8E4M3FN>, tensor<2x4x2xf32>)
func.func @fp8_block128_bf16_weights(%x: tensor<?x256xbf16>, %rw: tensor<2x256xbf16>, %w13: tensor<2x512x256xbf16>, %w2: tensor<2x256x256xbf16>) -> tensor<?x256xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 2, top_k = 1, hidden = 256, intermediate = 256, router = <kind = softmax_topk>, activation = <kind = swiglu>, quant = <kind = fp8_block128>>}
      : (tensor<?x256xbf16>, tensor<2x256xbf16>, tensor<2x512x256xbf16>, tensor<2x256x256xbf16>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// -----

// An expert-parallel layer: the dispatch routes over all 4 experts and keeps
// the rank's 2; moe-expert-parallel splits it.
// CHECK-LABEL: func @expert_parallel
// CHECK: moe.dispatch %{{.*}}, %{{.*}} {ep_size = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
// CHECK: moe.grouped_matmul %{{.*}}, %{{.*}} groups
func.func @expert_parallel(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// A layer that also gives its router logits: the route computes them.
// CHECK-LABEL: func @router_logits
// CHECK: %[[IDS:.*]], %[[WTS:.*]], %[[LOGITS:.*]] = moe.route %{{.*}}, %{{.*}} {router = #moe.router<kind = softmax_topk>} : (tensor<?x8xbf16>, tensor<4x8xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x4xf32>)
// CHECK: %[[OUT:.*]] = moe.combine
// CHECK: return %[[OUT]], %[[LOGITS]]
func.func @router_logits(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> (tensor<?x8xbf16>, tensor<?x4xf32>) {
  %0, %1 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> (tensor<?x8xbf16>, tensor<?x4xf32>)
  return %0, %1 : tensor<?x8xbf16>, tensor<?x4xf32>
}
