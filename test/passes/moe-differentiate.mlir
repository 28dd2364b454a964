// RUN: moe-opt %s -split-input-file --moe-decompose --moe-differentiate -verify-diagnostics | FileCheck %s

// A layer with shared experts behind a gate. The training forward splits
// each gated matmul into the matmul and its activation, and saves the
// routing (the router's f32 logits too, so the backward does not multiply
// the router again), the dispatched rows and each gate/up output (not the
// activations, which the backward recomputes, nor any per-choice output).
// CHECK-LABEL: func.func @layer_train
// CHECK-SAME: moe.saved = ["dispatch.rows", "dispatch.expert_offsets", "route.weights", "shared_gate.out", "shared_gate_up.out", "dispatch.tokens_per_expert", "gate_up.out", "dispatch.dispatched", "route.logits", "route.expert_ids"]
// Its dispatch is ordered: the backward's sums over an expert's rows are
// the same on every call.
// CHECK: moe.dispatch %arg0, %expert_ids {ordered}
// CHECK: %[[H:.*]] = moe.grouped_matmul %dispatched, %arg2 groups(%tokens_per_expert, %expert_offsets) : {{.*}} -> tensor<?x16xbf16>
// CHECK-NEXT: %[[A:.*]] = moe.activation %[[H]] {activation = #moe.activation<kind = swiglu>} : (tensor<?x16xbf16>) -> tensor<?x8xbf16>
// CHECK: return %{{.*}}, %rows, %expert_offsets, %weights, %out_5, %out_2, %tokens_per_expert, %out, %dispatched, %logits, %expert_ids :

// The backward: every argument has a gradient (the tokens' in bf16, the
// weights' in f32).
// CHECK-LABEL: func.func @layer_backward
// CHECK-SAME: %[[X:arg0]]: tensor<?x16xbf16>, %[[WR:arg1]]: tensor<4x16xbf16>, %[[W13:arg2]]: tensor<4x16x16xbf16>, %[[W2:arg3]]: tensor<4x16x8xbf16>, %[[S13:arg4]]: tensor<16x16xbf16>, %[[S2:arg5]]: tensor<16x8xbf16>, %[[SG:arg6]]: tensor<1x16xbf16>, %[[DOUT:arg7]]: tensor<?x16xbf16>, %[[ROWS:arg8]]: tensor<?x2xi32>, %[[OFF:arg9]]: tensor<5xi32>, %[[W:arg10]]: tensor<?x2xf32>, %[[GL:arg11]]: tensor<?x1xbf16>, %[[HS:arg12]]: tensor<?x16xbf16>, %[[CNT:arg13]]: tensor<4xi32>, %[[H:arg14]]: tensor<?x16xbf16>, %[[XD:arg15]]: tensor<?x16xbf16>, %[[LOGITS:arg16]]: tensor<?x4xf32>, %[[IDS:arg17]]: tensor<?x2xi32>)
// CHECK-SAME: -> (tensor<?x16xbf16>, tensor<4x16xf32>, tensor<4x16x16xf32>, tensor<4x16x8xf32>, tensor<16x16xf32>, tensor<16x8xf32>, tensor<1x16xf32>)
// CHECK-SAME: moe.gradients = array<i64: 0, 1, 2, 3, 4, 5, 6>
// The output's gradient laid out in the experts' rows where the forward's
// dispatch put their tokens, unweighted.
// CHECK: %[[DY:.*]] = moe.scatter %[[DOUT]], %[[ROWS]] offsets %[[OFF]] :
// The shared experts: dgrad of the down matmul, then the activation's
// backward with the gate (its gradient, the weighted activation for the
// wgrad), then the gate/up matmul's wgrad and dgrad (kept in f32).
// CHECK: %[[GS:.*]] = moe.grouped_matmul_dgrad %[[DOUT]], %[[S2]] :
// CHECK: %[[DHS:.*]], %[[AS:.*]], %[[DGL:.*]] = moe.activation_grad %[[GS]], %[[HS]] gate %[[GL]]
// CHECK: %[[DS2:.*]] = moe.grouped_matmul_wgrad %[[DOUT]] lhs %[[AS]] :
// CHECK: %[[DS13:.*]] = moe.grouped_matmul_wgrad %[[DHS]] lhs %[[X]] :
// CHECK: %[[DXS:.*]] = moe.grouped_matmul_dgrad %[[DHS]], %[[S13]] : {{.*}} -> tensor<?x16xf32>
// The routed experts, the same way with each row's routing weight.
// CHECK: %[[G:.*]] = moe.grouped_matmul_dgrad %[[DY]], %[[W2]] groups(%[[CNT]], %[[OFF]])
// CHECK: %[[DH:.*]], %[[AW:.*]], %[[DW:.*]] = moe.activation_grad %[[G]], %[[H]] rows(%[[ROWS]], %[[W]])
// CHECK: %[[DW2:.*]] = moe.grouped_matmul_wgrad %[[DY]] lhs %[[AW]] groups(%[[CNT]], %[[OFF]]) : {{.*}} -> tensor<4x16x8xf32>
// CHECK: %[[DW13:.*]] = moe.grouped_matmul_wgrad %[[DH]] lhs %[[XD]] groups(%[[CNT]], %[[OFF]]) : {{.*}} -> tensor<4x16x16xf32>
// CHECK: %[[DXD:.*]] = moe.grouped_matmul_dgrad %[[DH]], %[[W13]] groups(%[[CNT]], %[[OFF]])
// The router from the weights' gradient.
// CHECK: %[[DL:.*]] = moe.route_grad %[[X]], %[[WR]] logits %[[LOGITS]] choices(%[[IDS]], %[[DW]])
// CHECK: %[[DWR:.*]] = moe.grouped_matmul_wgrad %[[DL]] lhs %[[X]]
// CHECK: %[[DX1:.*]] = moe.grouped_matmul_dgrad %[[DL]], %[[WR]] acc %[[DXS]]
// The gate's logits.
// CHECK: %[[DSG:.*]] = moe.grouped_matmul_wgrad %[[DGL]] lhs %[[X]]
// CHECK: %[[DX2:.*]] = moe.grouped_matmul_dgrad %[[DGL]], %[[SG]] acc %[[DX1]]
// The tokens: their choices' rows summed back, with every other part.
// CHECK: %[[DX:.*]] = moe.combine %[[DXD]], %[[ROWS]] shared %[[DX2]]
// CHECK: return %[[DX]], %[[DWR]], %[[DW13]], %[[DW2]], %[[DS13]], %[[DS2]], %[[DSG]] :
func.func @layer(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                 %w13: tensor<4x16x16xbf16>, %w2: tensor<4x16x8xbf16>,
                 %s13: tensor<16x16xbf16>, %s2: tensor<16x8xbf16>,
                 %sg: tensor<1x16xbf16>) -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2) shared(%s13, %s2, %sg)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>,
                            shared_intermediate = 8, shared_gate = true>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4x16x16xbf16>,
         tensor<4x16x8xbf16>, tensor<16x16xbf16>, tensor<16x8xbf16>,
         tensor<1x16xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// Expert biases (GPT-OSS): the down matmul's bias adds each row's dot with
// it to its weight's gradient, and takes the rows' gradient weighted by
// their routing weights; the gate/up bias the sum of its rows' gradient.
// The router bias moves the logits: it takes their gradient.
// CHECK-LABEL: func.func @biases_backward
// CHECK-SAME: moe.gradients = array<i64: 0, 1, 2, 3, 4, 5, 6>
// CHECK: %[[DY:.*]] = moe.scatter %arg7, %[[ROWS:arg[0-9]+]] offsets %[[OFF:arg[0-9]+]] :
// CHECK: %[[G:.*]], %[[BD:.*]] = moe.grouped_matmul_dgrad %[[DY]], %arg4 groups({{.*}}) bias %arg6 :
// CHECK: moe.activation_grad %[[G]], %{{.*}} rows({{.*}}) bias_term %[[BD]] {activation = #moe.activation<kind = clamped_swiglu
// CHECK: %[[DYW:.*]] = moe.scatter %arg7, %[[ROWS]] offsets %[[OFF]] scale %{{.*}} :
// CHECK: moe.grouped_matmul_wgrad %[[DYW]] groups({{.*}}) : {{.*}} -> tensor<4x16xf32>
// CHECK: moe.grouped_matmul_wgrad %{{.*}} groups({{.*}}) : {{.*}} -> tensor<4x16xf32>
// CHECK: %[[DL:.*]] = moe.route_grad %arg0, %arg1 bias %arg2 logits %{{.*}} choices
// CHECK: moe.grouped_matmul_wgrad %[[DL]] : (tensor<?x4xf32>) -> tensor<4xf32>
func.func @biases(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                  %br: tensor<4xf32>, %w13: tensor<4x16x16xbf16>,
                  %w2: tensor<4x16x8xbf16>, %b13: tensor<4x16xbf16>,
                  %b2: tensor<4x16xbf16>) -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr, %br) experts(%w13, %w2) biases(%b13, %b2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = topk_softmax>,
                            activation = <kind = clamped_swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4xf32>,
         tensor<4x16x16xbf16>, tensor<4x16x8xbf16>, tensor<4x16xbf16>,
         tensor<4x16xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// DeepSeek-V3's score-correction bias only ranks the experts: it takes no
// gradient (argument 2 has none).
// CHECK-LABEL: func.func @selection_bias_backward
// CHECK-SAME: moe.gradients = array<i64: 0, 1, 3, 4>
// CHECK: moe.route_grad %arg0, %arg1 bias %arg2 logits %{{.*}} choices
// CHECK-NOT: moe.grouped_matmul_wgrad {{.*}} : (tensor<?x4xf32>) -> tensor<4xf32>
func.func @selection_bias(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                          %br: tensor<4xf32>, %w13: tensor<4x16x16xbf16>,
                          %w2: tensor<4x16x8xbf16>) -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr, %br) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8,
                            router = <kind = sigmoid_grouped_topk,
                                      renormalize = true, scaling = 2.5>,
                            activation = <kind = swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4xf32>,
         tensor<4x16x16xbf16>, tensor<4x16x8xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// FP8 block-128: a quantize is straight-through. The forward saves the
// dispatched rows as the gate/up matmul read them, E4M3 codes and scales,
// not in bf16. Each dgrad runs in FP8 as DeepSeek-V3's recipe does: the
// rows' gradient quantized in 1 x 128 tiles along N, the weights
// transposed and quantized in 128 x 128 blocks by the training forward,
// beside its own codes (moe-legalize makes the two one pass on sm_90a),
// and saved. Each wgrad runs in FP8 too, along its contraction (the
// rows): the saved codes of the rows are what the gate/up wgrad reads.
// CHECK-LABEL: func.func @fp8_train(
// CHECK-SAME: %{{[^:]*}}: tensor<?x128xbf16>, %{{[^:]*}}: tensor<4x128xbf16>, %[[FW13:[^:]*]]: tensor<4x256x128xbf16>, %[[FW2:[^:]*]]: tensor<4x128x128xbf16>
// CHECK-SAME: moe.saved = ["dispatch.rows", "dispatch.expert_offsets", "route.weights", "dispatch.tokens_per_expert", "gate_up.out", "down_weights_transposed.scales", "down_weights_transposed.data", "gate_up_input.data", "gate_up_input.scales", "gate_up_weights_transposed.scales", "gate_up_weights_transposed.data", "route.logits", "route.expert_ids"]
// CHECK: moe.quantize %[[FW13]] {{.*}} -> (tensor<4x256x128xf8E4M3FN>, tensor<4x2x1xf32>)
// CHECK: %[[FW13T:.*]] = moe.transpose %[[FW13]] : tensor<4x256x128xbf16> -> tensor<4x128x256xbf16>
// CHECK: moe.quantize %[[FW13T]] {{.*}} -> (tensor<4x128x256xf8E4M3FN>, tensor<4x1x2xf32>)
// CHECK: moe.quantize %[[FW2]] {{.*}} -> (tensor<4x128x128xf8E4M3FN>, tensor<4x1x1xf32>)
// CHECK: %[[FW2T:.*]] = moe.transpose %[[FW2]] : tensor<4x128x128xbf16> -> tensor<4x128x128xbf16>
// CHECK: moe.quantize %[[FW2T]]
// CHECK-LABEL: func.func @fp8_backward
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x128xbf16>, %{{[^:]*}}: tensor<4x128xbf16>, %[[W13:[^:]*]]: tensor<4x256x128xbf16>, %[[W2:[^:]*]]: tensor<4x128x128xbf16>
// CHECK-SAME: %[[W2S:[^:]*]]: tensor<4x1x1xf32>, %[[W2Q:[^:]*]]: tensor<4x128x128xf8E4M3FN>, %[[CODES:[^:]*]]: tensor<?x128xf8E4M3FN>, %[[SCALES:[^:]*]]: tensor<?x1xf32>, %[[W13S:[^:]*]]: tensor<4x1x2xf32>, %[[W13Q:[^:]*]]: tensor<4x128x256xf8E4M3FN>
// CHECK-SAME: -> (tensor<?x128xbf16>, tensor<4x128xf32>, tensor<4x256x128xf32>, tensor<4x128x128xf32>)
// CHECK-NOT: moe.transpose
// CHECK: %[[DY:.*]] = moe.scatter
// CHECK: %[[DYQ:.*]], %[[DYS:.*]] = moe.quantize %[[DY]] {scheme = #moe.quant<kind = fp8_block128>} : (tensor<?x128xbf16>) -> (tensor<?x128xf8E4M3FN>, tensor<?x1xf32>)
// CHECK: %[[G:.*]] = moe.grouped_matmul %[[DYQ]], %[[W2Q]] groups(%{{.*}}) scales(%[[DYS]], %[[W2S]])
// CHECK: %[[DH:.*]], %[[AW:.*]], %{{.*}} = moe.activation_grad %[[G]]
// CHECK: moe.grouped_matmul_wgrad %[[DY]] lhs %[[AW]] groups(%{{.*}}) {quant = #moe.quant<kind = fp8_block128>} : {{.*}} -> tensor<4x128x128xf32>
// CHECK-NOT: moe.dequantize
// CHECK: moe.grouped_matmul_wgrad %[[DH]] lhs %[[CODES]] groups(%{{.*}}) scale %[[SCALES]] {quant = #moe.quant<kind = fp8_block128>} : (tensor<?x256xbf16>, tensor<?x128xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>, tensor<?x1xf32>) -> tensor<4x256x128xf32>
// CHECK: %[[DHQ:.*]], %[[DHS:.*]] = moe.quantize %[[DH]] {{.*}} -> (tensor<?x256xf8E4M3FN>, tensor<?x2xf32>)
// CHECK: moe.grouped_matmul %[[DHQ]], %[[W13Q]] groups(%{{.*}}) scales(%[[DHS]], %[[W13S]]) {{.*}} -> tensor<?x128xbf16>
// CHECK-NOT: moe.grouped_matmul_dgrad {{.*}} groups
// CHECK-NOT: moe.transpose
func.func @fp8(%x: tensor<?x128xbf16>, %wr: tensor<4x128xbf16>,
               %w13: tensor<4x256x128xbf16>, %w2: tensor<4x128x128xbf16>)
    -> tensor<?x128xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 128,
                            intermediate = 128, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>,
                            quant = <kind = fp8_block128>>}
      : (tensor<?x128xbf16>, tensor<4x128xbf16>, tensor<4x256x128xbf16>,
         tensor<4x128x128xbf16>) -> tensor<?x128xbf16>
  return %out : tensor<?x128xbf16>
}

// -----

// MXFP8 with shared experts: their input, the layer's own, is quantized
// again in the backward (its gradient joins the tokens' in f32), and so are
// their weights; the gate is not quantized. On Hopper MXFP8 gains nothing
// over bf16 in a matmul, so its dgrads multiply dequantized weights.
// CHECK-LABEL: func.func @mxfp8_train
// CHECK-NOT: moe.saved = [{{.*}}shared_gate_up_input
// CHECK-LABEL: func.func @mxfp8_backward
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x64xbf16>
// CHECK-NOT: moe.transpose
// CHECK: %[[XQ:.*]], %[[XS:.*]] = moe.quantize %[[X]] {scheme = #moe.quant<kind = mxfp8>} : (tensor<?x64xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
// CHECK: moe.dequantize %[[XQ]], %[[XS]]
// CHECK-NOT: moe.transpose
// CHECK: return
func.func @mxfp8(%x: tensor<?x64xbf16>, %wr: tensor<4x64xbf16>,
                 %w13: tensor<4x64x64xbf16>, %w2: tensor<4x64x32xbf16>,
                 %s13: tensor<64x64xbf16>, %s2: tensor<64x32xbf16>,
                 %sg: tensor<1x64xbf16>) -> tensor<?x64xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2) shared(%s13, %s2, %sg)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 64,
                            intermediate = 32, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>,
                            shared_intermediate = 32, shared_gate = true,
                            quant = <kind = mxfp8>>}
      : (tensor<?x64xbf16>, tensor<4x64xbf16>, tensor<4x64x64xbf16>,
         tensor<4x64x32xbf16>, tensor<64x64xbf16>, tensor<64x32xbf16>,
         tensor<1x64xbf16>) -> tensor<?x64xbf16>
  return %out : tensor<?x64xbf16>
}

// -----

// Quantized weights given to the layer (a checkpoint's, with their scales)
// have no bf16 value for a gradient to belong to.
func.func @fp8_weights(%x: tensor<?x128xbf16>, %wr: tensor<4x128xbf16>,
                       %w13: tensor<4x256x128xf8E4M3FN>,
                       %w2: tensor<4x128x128xf8E4M3FN>,
                       %s13: tensor<4x2x1xf32>, %s2: tensor<4x1x1xf32>)
    -> tensor<?x128xbf16> {
  // expected-error @below {{multiplies quantized weights the layer is given: a layer trains from bf16 (or f32) weights, which it quantizes itself}}
  %out = moe.layer %x router(%wr) experts(%w13, %w2) scales(%s13, %s2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 128,
                            intermediate = 128, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>,
                            quant = <kind = fp8_block128>>}
      : (tensor<?x128xbf16>, tensor<4x128xbf16>, tensor<4x256x128xf8E4M3FN>,
         tensor<4x128x128xf8E4M3FN>, tensor<4x2x1xf32>, tensor<4x1x1xf32>)
      -> tensor<?x128xbf16>
  return %out : tensor<?x128xbf16>
}

// -----

// Llama-4: the routing weight scales each token into its row. The tokens'
// gradient sums their rows' gradients times those weights, and a weight's
// gradient is its row's gradient dotted with the token; the router's is
// the sigmoid's.
// CHECK-LABEL: func.func @llama4_backward
// CHECK: %[[DXD:.*]] = moe.grouped_matmul_dgrad %{{.*}}, %arg2 groups
// CHECK: %[[DW:.*]] = moe.gather_dot %[[DXD]], %arg0 rows %[[ROWS:arg[0-9]+]] :
// CHECK: moe.route_grad %arg0, %arg1 logits %{{.*}} choices(%{{.*}}, %[[DW]]) {router = #moe.router<kind = sigmoid_scale_input>}
// CHECK: moe.combine %[[DXD]], %[[ROWS]] weights %[[W:arg[0-9]+]] shared
func.func @llama4(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                  %w13: tensor<4x16x16xbf16>, %w2: tensor<4x16x8xbf16>)
    -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 1, hidden = 16,
                            intermediate = 8,
                            router = <kind = sigmoid_scale_input>,
                            activation = <kind = swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4x16x16xbf16>,
         tensor<4x16x8xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// An expert-parallel layer: the combine's adjoint sends the output's
// gradient to the experts' ranks with each choice's weight (unapplied); the
// activation's backward applies each row's weight (linear_gate) and gives
// its gradient, which goes home with the row's gradient; the layout's
// counts and offsets are the backward's own exchange's.
// CHECK-LABEL: func.func @ep_backward(
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<?x16xbf16>, %{{.*}}: tensor<4x16xbf16>, %[[W13:[a-z0-9]+]]: tensor<2x16x16xbf16>, %[[W2:[a-z0-9]+]]: tensor<2x16x8xbf16>, %[[DY:[a-z0-9]+]]: tensor<?x16xbf16>
// CHECK: %[[SENT:.*]], %[[ROWS:.*]] = moe.ep_dispatch_send %[[DY]], %{{.*}} scale %{{.*}} {local_experts = 2 : i64}
// CHECK: %[[G:.*]], %[[COUNTS:.*]], %[[OFFSETS:.*]], %[[ORIGIN:.*]], %[[RW:.*]] = moe.ep_dispatch_recv %[[SENT]] {weights} : (tensor<2xi32>) -> (tensor<?x16xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x1xf32>)
// CHECK: %[[DA:.*]] = moe.grouped_matmul_dgrad %[[G]], %[[W2]] groups(%[[COUNTS]], %[[OFFSETS]])
// CHECK: %[[DH:.*]], %[[AW:.*]], %[[DW:.*]] = moe.activation_grad %[[DA]], %{{.*}} gate %[[RW]] {{{.*}}linear_gate}
// CHECK: %[[DX:.*]] = moe.grouped_matmul_dgrad %[[DH]], %[[W13]] groups(%[[COUNTS]], %[[OFFSETS]])
// CHECK: %[[BACK:.*]] = moe.ep_combine_send %[[DX]], %[[ORIGIN]] values %[[DW]]
// CHECK: %[[HOME:.*]], %[[DWT:.*]] = moe.ep_combine_recv %[[BACK]], %[[ROWS]] : (tensor<2xi32>, tensor<?x2xi32>) -> (tensor<?x16xbf16>, tensor<?x2xf32>)
// CHECK: moe.route_grad %[[X]], {{.*}} choices(%{{.*}}, %[[DWT]])
// CHECK: moe.combine %[[HOME]], %[[ROWS]] shared
func.func @ep(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
              %w13: tensor<2x16x16xbf16>, %w2: tensor<2x16x8xbf16>)
    -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<2x16x16xbf16>,
         tensor<2x16x8xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// An expert-parallel layer whose down matmul has a bias: its gradient needs
// each row's weight applied to the row's gradient on the experts' rank.
func.func @ep_bias(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                   %w13: tensor<2x16x16xbf16>, %w2: tensor<2x16x8xbf16>,
                   %b13: tensor<2x16xbf16>, %b2: tensor<2x16xbf16>)
    -> tensor<?x16xbf16> {
  // expected-error @below {{has a bias on an expert-parallel layer's experts, whose backward moe-differentiate does not build yet}}
  %out = moe.layer %x router(%wr) experts(%w13, %w2) biases(%b13, %b2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<2x16x16xbf16>,
         tensor<2x16x8xbf16>, tensor<2x16xbf16>, tensor<2x16xbf16>)
      -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// With recompute, the forward saves no gate/up output: the backward
// multiplies the saved dispatched rows again.
// RUN: moe-opt %s -split-input-file --moe-decompose --moe-differentiate=recompute=true -verify-diagnostics | FileCheck %s --check-prefix=RECOMPUTE
// RECOMPUTE-LABEL: func.func @recompute_train
// RECOMPUTE-SAME: moe.saved = ["dispatch.rows", "dispatch.expert_offsets", "route.weights", "dispatch.tokens_per_expert", "dispatch.dispatched", "route.logits", "route.expert_ids"]
// RECOMPUTE-LABEL: func.func @recompute_backward
// RECOMPUTE: %[[H:.*]] = moe.grouped_matmul %arg{{[0-9]+}}, %arg2 groups(%arg{{[0-9]+}}, %arg{{[0-9]+}}) : {{.*}} -> tensor<?x16xbf16>
// RECOMPUTE-NEXT: %[[G:.*]] = moe.grouped_matmul_dgrad
// RECOMPUTE-NEXT: moe.activation_grad %[[G]], %[[H]] rows
func.func @recompute(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                     %w13: tensor<4x16x16xbf16>, %w2: tensor<4x16x8xbf16>)
    -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4x16x16xbf16>,
         tensor<4x16x8xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// With bf16-grads, every weight's gradient is bf16 (the weights' type),
// summed in f32 by its op and rounded once; the tokens' stays bf16.
// RUN: moe-opt %s -split-input-file --moe-decompose --moe-differentiate=bf16-grads=true -verify-diagnostics | FileCheck %s --check-prefix=BF16
// BF16-LABEL: func.func @bf16_grads_backward
// BF16-SAME: -> (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4x16x16xbf16>, tensor<4x16x8xbf16>)
// BF16-NOT: moe.grouped_matmul_wgrad {{.*}} -> tensor<{{.*}}xf32>
// BF16: return
func.func @bf16_grads(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                      %w13: tensor<4x16x16xbf16>, %w2: tensor<4x16x8xbf16>)
    -> tensor<?x16xbf16> {
  %out = moe.layer %x router(%wr) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 16,
                            intermediate = 8, router = <kind = softmax_topk>,
                            activation = <kind = swiglu>>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4x16x16xbf16>,
         tensor<4x16x8xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}

// -----

// The layer's own argument combined in (a residual) would need the output's
// gradient added to its own: refused rather than dropped.
func.func @residual(%x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>)
    -> tensor<?x16xbf16> {
  %ids, %w = moe.route %x, %wr {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>)
      -> (tensor<?x2xi32>, tensor<?x2xf32>)
  %d, %c, %o, %rows = moe.dispatch %x, %ids
      : (tensor<?x16xbf16>, tensor<?x2xi32>)
      -> (tensor<?x16xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  // expected-error @below {{combines an argument of the layer, whose gradient moe-differentiate does not give}}
  %out = moe.combine %d, %rows weights %w shared %x
      : (tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>,
         tensor<?x16xbf16>) -> tensor<?x16xbf16>
  return %out : tensor<?x16xbf16>
}
