// RUN: moe-opt %s -split-input-file --moe-export-interface | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-export-interface=target=sm_90a | FileCheck %s --check-prefix=GPU
// RUN: moe-opt %s -split-input-file --moe-export-interface=layer=bad -verify-diagnostics -o /dev/null

// Each function of moe ops that a library could be gets an interface; one
// named by `layer` (as moe-compile names the one it compiles) must be one,
// and the @bad ones below say why they are not.

// A layer's arguments are named after the operands they feed, its result
// is `out`; the config comes along for the description JSON, and the
// symbols follow from the target.
// CHECK-LABEL: func.func @layer(
// CHECK-SAME: moe.interface = #moe.interface<name = "layer", target = cpu,
// CHECK-SAME: args = [#moe.argument<name = "hidden_states", type = tensor<?x8xbf16>>, #moe.argument<name = "router_weight", type = tensor<4x8xbf16>>, #moe.argument<name = "w13", type = tensor<4x16x8xbf16>>, #moe.argument<name = "w2", type = tensor<4x8x8xbf16>>, #moe.argument<name = "out", type = tensor<?x8xbf16>, output = true>],
// CHECK-SAME: config = <experts = 4,
// CHECK-SAME: symbols = {forward = "moe_layer_forward", layer_info = "moe_layer_info"}>
// GPU-LABEL: func.func @layer(
// GPU-SAME: target = sm_90a
// GPU-SAME: symbols = {forward = "moe_layer_forward", last_error = "moe_last_error", layer_info = "moe_layer_info", workspace_size = "moe_layer_workspace_size"}>
func.func @layer(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
                 %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>)
    -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>)
      -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// Expert parallel: the ranks, and on the CPU the buffers a rank allocates,
// linear in the capacity init takes (runtime/EpLayout.h); init and
// finalize are exported. The GPU's capacity and state come with its plan.
// CHECK-LABEL: func.func @ep(
// CHECK-SAME: expert_parallel = <ranks = 2, local_experts = 2, experts = 4, top_k = 2, hidden = 8, send_bytes = 96 + 160 * T, recv_bytes = 112 + 200 * T>
// CHECK-SAME: symbols = {ep_finalize = "moe_ep_ep_finalize", ep_init = "moe_ep_ep_init", ep_leave = "moe_ep_ep_leave", forward = "moe_ep_forward", last_error = "moe_last_error", layer_info = "moe_layer_info"}>
// GPU-LABEL: func.func @ep(
// GPU-SAME: expert_parallel = <ranks = 2, local_experts = 2, experts = 4, top_k = 2, hidden = 8>
// GPU-SAME: ep_status = "moe_ep_ep_status"
func.func @ep(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
              %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>)
    -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>)
      -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// Attention: query, key and value, no config.
// CHECK-LABEL: func.func @attention(
// CHECK-SAME: args = [#moe.argument<name = "query", type = tensor<1x64x2x64xbf16>>, #moe.argument<name = "key", type = tensor<1x64x2x64xbf16>>, #moe.argument<name = "value", type = tensor<1x64x2x64xbf16>>, #moe.argument<name = "out", type = tensor<1x64x2x64xbf16>, output = true>], symbols
func.func @attention(%q: tensor<1x64x2x64xbf16>, %k: tensor<1x64x2x64xbf16>,
                     %v: tensor<1x64x2x64xbf16>) -> tensor<1x64x2x64xbf16> {
  %0 = moe.attention %q, %k, %v
      : (tensor<1x64x2x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x64xbf16>)
      -> tensor<1x64x2x64xbf16>
  return %0 : tensor<1x64x2x64xbf16>
}

// -----

// A function of L1 ops: arguments by `moe.name`, else argN.
// CHECK-LABEL: func.func @steps(
// CHECK-SAME: args = [#moe.argument<name = "x", type = tensor<?x8xbf16>>, #moe.argument<name = "arg1", type = tensor<?x2xi32>>, #moe.argument<name = "out", type = tensor<?x8xbf16>, output = true>]
func.func @steps(%x: tensor<?x8xbf16> {moe.name = "x"}, %ids: tensor<?x2xi32>)
    -> tensor<?x8xbf16> {
  %d, %c, %o, %r = moe.dispatch %x, %ids
      : (tensor<?x8xbf16>, tensor<?x2xi32>)
      -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return %d : tensor<?x8xbf16>
}

// -----

// A layer that gives its router logits: a second output after `out`.
// CHECK-LABEL: func.func @logits(
// CHECK-SAME: #moe.argument<name = "out", type = tensor<?x8xbf16>, output = true>, #moe.argument<name = "router_logits", type = tensor<?x4xf32>, output = true>]
func.func @logits(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
                  %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>)
    -> (tensor<?x8xbf16>, tensor<?x4xf32>) {
  %0, %1 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>)
      -> (tensor<?x8xbf16>, tensor<?x4xf32>)
  return %0, %1 : tensor<?x8xbf16>, tensor<?x4xf32>
}

// -----

// Several results: no library can call it, so it gets no interface
// (unless it is the layer asked for).
// CHECK-LABEL: func.func @two(
// CHECK-NOT: moe.interface
func.func @two(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>)
    -> (tensor<?x8xbf16>, tensor<4xi32>) {
  %d, %c, %o, %r = moe.dispatch %x, %ids
      : (tensor<?x8xbf16>, tensor<?x2xi32>)
      -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return %d, %c : tensor<?x8xbf16>, tensor<4xi32>
}

// -----

// expected-error @+1 {{'func.func' op must return one tensor to be compiled, but returns 2}}
func.func @bad(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>)
    -> (tensor<?x8xbf16>, tensor<4xi32>) {
  %d, %c, %o, %r = moe.dispatch %x, %ids
      : (tensor<?x8xbf16>, tensor<?x2xi32>)
      -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return %d, %c : tensor<?x8xbf16>, tensor<4xi32>
}

// -----

// expected-error @+1 {{'func.func' op argument 'arg2' may be dynamic only in its first (token) dimension}}
func.func @bad(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>,
               %unused: tensor<4x?xbf16>) -> tensor<?x8xbf16> {
  %d, %c, %o, %r = moe.dispatch %x, %ids
      : (tensor<?x8xbf16>, tensor<?x2xi32>)
      -> (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>, tensor<?x2xi32>)
  return %d : tensor<?x8xbf16>
}

// -----

func.func @bad(%x: tensor<?x8xbf16>, %w13: tensor<4x16x8xbf16>,
               %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  %rw = arith.constant dense<0.0> : tensor<4x8xbf16>
  // expected-error @+1 {{'moe.layer' op operand 'router_weight' must be its own function argument to be compiled}}
  %0 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>)
      -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// expected-error @+1 {{'func.func' op must return the layer's results, in order}}
func.func @bad(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>,
               %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>)
    -> tensor<?x8xbf16> {
  %0, %1 = moe.layer %x router(%rw) experts(%w13, %w2)
      {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8,
                            router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>)
      -> (tensor<?x8xbf16>, tensor<?x4xf32>)
  return %0 : tensor<?x8xbf16>
}
