// RUN: moe-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{router n_group must be at least 1, but is 0}}
func.func private @f() attributes {r = #moe.router<kind = sigmoid_grouped_topk, n_group = 0>}

// -----

// expected-error @+1 {{router topk_group must be between 1 and n_group (4), but is 5}}
func.func private @f() attributes {r = #moe.router<kind = sigmoid_grouped_topk, n_group = 4, topk_group = 5>}

// -----

// expected-error @+1 {{router kind 'softmax_topk' does not group experts}}
func.func private @f() attributes {r = #moe.router<kind = softmax_topk, n_group = 2>}

// -----

// expected-error @+1 {{router kind 'topk_softmax' cannot renormalize}}
func.func private @f() attributes {r = #moe.router<kind = topk_softmax, renormalize = true>}

// -----

// expected-error @+1 {{router scaling must be a positive finite number, but is 0}}
func.func private @f() attributes {r = #moe.router<kind = softmax_topk, scaling = 0.0>}

// -----

// expected-error @+2 {{expected 'true' or 'false'}}
// expected-error @+1 {{failed to parse Moe_RouterAttr parameter 'renormalize'}}
func.func private @f() attributes {r = #moe.router<kind = softmax_topk, renormalize = 1>}

// -----

// expected-error @+2 {{expected ::mlir::moe::RouterKind to be one of: softmax_topk, topk_softmax, sigmoid_grouped_topk, sigmoid_scale_input}}
// expected-error @+1 {{failed to parse Moe_RouterAttr parameter 'kind'}}
func.func private @f() attributes {r = #moe.router<kind = greedy>}

// -----

// expected-error @+1 {{alpha and limit apply only to clamped_swiglu}}
func.func private @f() attributes {a = #moe.activation<kind = swiglu, limit = 5.0>}

// -----

// expected-error @+1 {{activation alpha must be a positive finite number, but is 0}}
func.func private @f() attributes {a = #moe.activation<kind = clamped_swiglu, alpha = 0>}

// -----

// expected-error @+1 {{activation limit must be a positive finite number, but is 0}}
func.func private @f() attributes {a = #moe.activation<kind = clamped_swiglu, limit = 0.0>}

// -----

// expected-error @+1 {{scale rounding applies only to mxfp8}}
func.func private @f() attributes {q = #moe.quant<kind = fp8_block128, rounding = ceil>}

// -----

// expected-error @+1 {{layer experts must be positive, but is 0}}
func.func private @f() attributes {c = #moe.config<experts = 0, top_k = 1, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{layer hidden must be positive, but is -8}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 1, hidden = -8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{top_k (5) must not exceed the number of experts (4)}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 5, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{shared_intermediate must not be negative, but is -1}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 1, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_intermediate = -1>}

// -----

// expected-error @+1 {{shared_gate needs shared experts (shared_intermediate > 0)}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 1, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, shared_gate = true>}

// -----

// expected-error @+1 {{ep_size (3) must divide the number of experts (4)}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 1, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 3>}

// -----

// expected-error @+1 {{router n_group (3) must divide the number of experts (256)}}
func.func private @f() attributes {c = #moe.config<experts = 256, top_k = 8, hidden = 8, intermediate = 8, router = <kind = sigmoid_grouped_topk, n_group = 3>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{router groups must hold at least 2 experts (a group scores by its top two), but 8 experts in 8 groups hold 1}}
func.func private @f() attributes {c = #moe.config<experts = 8, top_k = 2, hidden = 8, intermediate = 8, router = <kind = sigmoid_grouped_topk, n_group = 8, topk_group = 4>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{top_k (8) exceeds the 4 experts in the topk_group (1) groups a token may use}}
func.func private @f() attributes {c = #moe.config<experts = 32, top_k = 8, hidden = 8, intermediate = 8, router = <kind = sigmoid_grouped_topk, n_group = 8, topk_group = 1>, activation = <kind = swiglu>>}

// -----

// expected-error @+1 {{struct is missing required parameter: intermediate}}
func.func private @f() attributes {c = #moe.config<experts = 4, top_k = 1, hidden = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
