// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// CHECK-LABEL: func @layer_minimal
// CHECK: moe.layer %{{[^ ,)]+}} router(%{{[^ ,)]+}}) experts(%{{[^ ,)]+}}, %{{[^ ,)]+}}) {config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
func.func @layer_minimal(%x: tensor<?x64xbf16>, %rw: tensor<8x64xbf16>,
    %w13: tensor<8x64x64xbf16>, %w2: tensor<8x64x32xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {
      config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32,
                           router = #moe.router<kind = softmax_topk>,
                           activation = #moe.activation<kind = swiglu>>}
      : (tensor<?x64xbf16>, tensor<8x64xbf16>, tensor<8x64x64xbf16>, tensor<8x64x32xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}

// Every optional operand group and every config field that has a default.
// CHECK-LABEL: func @layer_everything
// CHECK: moe.layer %{{[^ ,)]+}} router(%{{[^ ,)]+}}, %{{[^ ,)]+}}) experts(%{{[^ ,)]+}}, %{{[^ ,)]+}}) scales(%{{[^ ,)]+}}, %{{[^ ,)]+}}) biases(%{{[^ ,)]+}}, %{{[^ ,)]+}}) shared(%{{[^ ,)]+}}, %{{[^ ,)]+}}, %{{[^ ,)]+}})
// CHECK-SAME: config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32, router = <kind = topk_softmax, scaling = 0.75>, activation = <kind = clamped_swiglu, alpha = 1.5, limit = 10.0>, shared_intermediate = 16, shared_gate = true, quant = <kind = mxfp8, rounding = ceil>, ep_size = 2>
func.func @layer_everything(%x: tensor<3x64xbf16>, %rw: tensor<8x64xf32>, %rb: tensor<8xf32>,
    %w13: tensor<4x64x64xf8E4M3FN>, %w2: tensor<4x64x32xf8E4M3FN>,
    %s13: tensor<4x64x2xf8E8M0FNU>, %s2: tensor<4x64x1xf8E8M0FNU>,
    %b13: tensor<4x64xbf16>, %b2: tensor<4x64xf32>,
    %sw13: tensor<32x64xbf16>, %sw2: tensor<64x16xbf16>, %sg: tensor<1x64xbf16>) -> tensor<3x64xbf16> {
  %0 = moe.layer %x router(%rw, %rb) experts(%w13, %w2) scales(%s13, %s2)
      biases(%b13, %b2) shared(%sw13, %sw2, %sg) {
      config = #moe.config<experts = 8, top_k = 2, hidden = 64, intermediate = 32,
                           router = #moe.router<kind = topk_softmax, scaling = 0.75>,
                           activation = #moe.activation<kind = clamped_swiglu, alpha = 1.5, limit = 10>,
                           shared_intermediate = 16, shared_gate = true,
                           quant = #moe.quant<kind = mxfp8, rounding = ceil>, ep_size = 2>}
      : (tensor<3x64xbf16>, tensor<8x64xf32>, tensor<8xf32>, tensor<4x64x64xf8E4M3FN>,
         tensor<4x64x32xf8E4M3FN>, tensor<4x64x2xf8E8M0FNU>, tensor<4x64x1xf8E8M0FNU>,
         tensor<4x64xbf16>, tensor<4x64xf32>, tensor<32x64xbf16>, tensor<64x16xbf16>,
         tensor<1x64xbf16>) -> tensor<3x64xbf16>
  return %0 : tensor<3x64xbf16>
}

// CHECK-LABEL: func @layer_fp8_block128
// CHECK: scales(%{{[^ ,)]+}}, %{{[^ ,)]+}})
// CHECK-SAME: router = <kind = sigmoid_scale_input>
// CHECK-SAME: quant = <kind = fp8_block128>
func.func @layer_fp8_block128(%x: tensor<?x256xbf16>, %rw: tensor<4x256xbf16>,
    %w13: tensor<4x512x256xf8E4M3FN>, %w2: tensor<4x256x256xf8E4M3FN>,
    %s13: tensor<4x4x2xf32>, %s2: tensor<4x256x2xf32>) -> tensor<?x256xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) scales(%s13, %s2) {
      config = #moe.config<experts = 4, top_k = 1, hidden = 256, intermediate = 256,
                           router = #moe.router<kind = sigmoid_scale_input>,
                           activation = #moe.activation<kind = swiglu>,
                           quant = #moe.quant<kind = fp8_block128>>}
      : (tensor<?x256xbf16>, tensor<4x256xbf16>, tensor<4x512x256xf8E4M3FN>,
         tensor<4x256x256xf8E4M3FN>, tensor<4x4x2xf32>, tensor<4x256x2xf32>) -> tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// CHECK-LABEL: func @attention
// CHECK: moe.attention %{{[^ ,)]+}}, %{{[^ ,)]+}}, %{{[^ ,)]+}} {causal, scale = 1.250000e-01 : f32}
// CHECK: moe.attention %{{[^ ,)]+}}, %{{[^ ,)]+}}, %{{[^ ,)]+}} :
func.func @attention(%q: tensor<2x?x32x128xbf16>, %k: tensor<2x?x8x128xbf16>,
    %v: tensor<2x?x8x64xbf16>) -> (tensor<2x?x32x64xbf16>, tensor<2x?x32x64xbf16>) {
  %0 = moe.attention %q, %k, %v {causal, scale = 0.125 : f32}
      : (tensor<2x?x32x128xbf16>, tensor<2x?x8x128xbf16>, tensor<2x?x8x64xbf16>) -> tensor<2x?x32x64xbf16>
  %1 = moe.attention %q, %k, %v
      : (tensor<2x?x32x128xbf16>, tensor<2x?x8x128xbf16>, tensor<2x?x8x64xbf16>) -> tensor<2x?x32x64xbf16>
  return %0, %1 : tensor<2x?x32x64xbf16>, tensor<2x?x32x64xbf16>
}

// CHECK-LABEL: func @route
// CHECK: moe.route %{{[^ ,)]+}}, %{{[^ ,)]+}} bias %{{[^ ,)]+}} {router = #moe.router<kind = sigmoid_grouped_topk, renormalize = true, n_group = 4, topk_group = 2, scaling = 2.5>}
// CHECK: moe.route %{{[^ ,)]+}}, %{{[^ ,)]+}} {router = #moe.router<kind = softmax_topk, renormalize = true>}
func.func @route(%x: tensor<?x64xbf16>, %rw: tensor<16x64xbf16>, %b: tensor<16xf32>)
    -> (tensor<?x4xi32>, tensor<?x4xf32>, tensor<?x2xi32>, tensor<?x2xf32>) {
  %ids, %w = moe.route %x, %rw bias %b {router = #moe.router<kind = sigmoid_grouped_topk,
      renormalize = true, n_group = 4, topk_group = 2, scaling = 2.5>}
      : (tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<16xf32>) -> (tensor<?x4xi32>, tensor<?x4xf32>)
  %ids2, %w2 = moe.route %x, %rw {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x64xbf16>, tensor<16x64xbf16>) -> (tensor<?x2xi32>, tensor<?x2xf32>)
  return %ids, %w, %ids2, %w2 : tensor<?x4xi32>, tensor<?x4xf32>, tensor<?x2xi32>, tensor<?x2xf32>
}

// CHECK-LABEL: func @dispatch
// CHECK: moe.dispatch %{{[^ ,)]+}}, %{{[^ ,)]+}} {align = 128 : i64}
// CHECK: moe.dispatch %{{[^ ,)]+}}, %{{[^ ,)]+}} scale %{{[^ ,)]+}} :
func.func @dispatch(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  %d, %c, %o, %r = moe.dispatch %x, %ids {align = 128}
      : (tensor<?x64xbf16>, tensor<?x2xi32>) -> (tensor<?x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>)
  %d2, %c2, %o2, %r2 = moe.dispatch %x, %ids scale %w
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> (tensor<?x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>)
  return
}

// CHECK-LABEL: func @scatter
// CHECK: moe.scatter %{{[^ ,)]+}}, %{{[^ ,)]+}} offsets %{{[^ ,)]+}} : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>) -> tensor<?x64xbf16>
// CHECK: moe.scatter %{{[^ ,)]+}}, %{{[^ ,)]+}} offsets %{{[^ ,)]+}} scale %{{[^ ,)]+}} {align = 128 : i64}
func.func @scatter(%g: tensor<?x64xbf16>, %rows: tensor<?x2xi32>,
                   %off: tensor<9xi32>, %w: tensor<?x2xf32>) {
  %0 = moe.scatter %g, %rows offsets %off
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>) -> tensor<?x64xbf16>
  %1 = moe.scatter %g, %rows offsets %off scale %w {align = 128}
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<9xi32>, tensor<?x2xf32>) -> tensor<?x64xbf16>
  return
}

// CHECK-LABEL: func @transpose
// CHECK: moe.transpose %{{[^ ,)]+}} : tensor<4x64x40xbf16> -> tensor<4x40x64xbf16>
func.func @transpose(%w: tensor<4x64x40xbf16>) -> tensor<4x40x64xbf16> {
  %0 = moe.transpose %w : tensor<4x64x40xbf16> -> tensor<4x40x64xbf16>
  return %0 : tensor<4x40x64xbf16>
}

// CHECK-LABEL: func @pad
// CHECK: moe.pad %{{[^ ,)]+}} : tensor<?x100xbf16> -> tensor<?x104xbf16>
// CHECK: moe.pad %{{[^ ,)]+}} : tensor<4x64x40xf8E4M3FN> -> tensor<4x64x48xf8E4M3FN>
func.func @pad(%x: tensor<?x100xbf16>, %w: tensor<4x64x40xf8E4M3FN>) -> (tensor<?x104xbf16>, tensor<4x64x48xf8E4M3FN>) {
  %0 = moe.pad %x : tensor<?x100xbf16> -> tensor<?x104xbf16>
  %1 = moe.pad %w : tensor<4x64x40xf8E4M3FN> -> tensor<4x64x48xf8E4M3FN>
  return %0, %1 : tensor<?x104xbf16>, tensor<4x64x48xf8E4M3FN>
}

// CHECK-LABEL: func @quantize
// CHECK: moe.quantize %{{[^ ,)]+}} {scheme = #moe.quant<kind = mxfp8>}
// CHECK: moe.quantize %{{[^ ,)]+}} {scheme = #moe.quant<kind = fp8_block128>}
// CHECK: moe.quantize %{{[^ ,)]+}} {scheme = #moe.quant<kind = fp8_block128>}
// CHECK: moe.dequantize %{{[^ ,)]+}}, %{{[^ ,)]+}} {scheme = #moe.quant<kind = mxfp8, rounding = ceil>}
func.func @quantize(%x: tensor<?x100xbf16>, %w: tensor<4x300x100xbf16>) -> tensor<?x100xf32> {
  %d, %s = moe.quantize %x {scheme = #moe.quant<kind = mxfp8>}
      : (tensor<?x100xbf16>) -> (tensor<?x100xf8E4M3FN>, tensor<?x4xf8E8M0FNU>)
  %d2, %s2 = moe.quantize %x {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<?x100xbf16>) -> (tensor<?x100xf8E4M3FN>, tensor<?x1xf32>)
  %d3, %s3 = moe.quantize %w {scheme = #moe.quant<kind = fp8_block128>}
      : (tensor<4x300x100xbf16>) -> (tensor<4x300x100xf8E4M3FN>, tensor<4x3x1xf32>)
  %r = moe.dequantize %d, %s {scheme = #moe.quant<kind = mxfp8, rounding = ceil>}
      : (tensor<?x100xf8E4M3FN>, tensor<?x4xf8E8M0FNU>) -> tensor<?x100xf32>
  return %r : tensor<?x100xf32>
}

// CHECK-LABEL: func @grouped_matmul
// CHECK: moe.grouped_matmul %{{[^ ,)]+}}, %{{[^ ,)]+}} groups(%{{[^ ,)]+}}, %{{[^ ,)]+}}) bias %{{[^ ,)]+}} {activation = #moe.activation<kind = clamped_swiglu>}
// CHECK: moe.grouped_matmul %{{[^ ,)]+}}, %{{[^ ,)]+}} groups(%{{[^ ,)]+}}, %{{[^ ,)]+}}) scales(%{{[^ ,)]+}}, %{{[^ ,)]+}}) :
// CHECK: moe.grouped_matmul %{{[^ ,)]+}}, %{{[^ ,)]+}} bias %{{[^ ,)]+}} :
func.func @grouped_matmul(%a: tensor<?x64xbf16>, %b: tensor<8x32x64xbf16>, %bias: tensor<8x32xf32>,
    %c: tensor<8xi32>, %o: tensor<9xi32>, %aq: tensor<?x64xf8E4M3FN>, %as: tensor<?x2xf8E8M0FNU>,
    %bq: tensor<8x32x64xf8E4M3FN>, %bs: tensor<8x32x2xf8E8M0FNU>, %dense: tensor<32x64xbf16>,
    %dbias: tensor<32xbf16>) {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o) bias %bias
      {activation = #moe.activation<kind = clamped_swiglu>}
      : (tensor<?x64xbf16>, tensor<8x32x64xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<8x32xf32>) -> tensor<?x16xbf16>
  %1 = moe.grouped_matmul %aq, %bq groups(%c, %o) scales(%as, %bs)
      : (tensor<?x64xf8E4M3FN>, tensor<8x32x64xf8E4M3FN>, tensor<8xi32>, tensor<9xi32>,
         tensor<?x2xf8E8M0FNU>, tensor<8x32x2xf8E8M0FNU>) -> tensor<?x32xf32>
  %2 = moe.grouped_matmul %a, %dense bias %dbias
      : (tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16>) -> tensor<?x32xbf16>
  return
}

// CHECK-LABEL: func @combine
// CHECK: moe.combine %{{[^ ,)]+}}, %{{[^ ,)]+}} weights %{{[^ ,)]+}} shared %{{[^ ,)]+}} gate %{{[^ ,)]+}} :
// CHECK: moe.combine %{{[^ ,)]+}}, %{{[^ ,)]+}} :
func.func @combine(%e: tensor<?x64xbf16>, %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>,
    %s: tensor<?x64xbf16>, %g: tensor<?x1xbf16>) -> (tensor<?x64xbf16>, tensor<?x64xbf16>) {
  %0 = moe.combine %e, %rows weights %w shared %s gate %g
      : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>, tensor<?x64xbf16>, tensor<?x1xbf16>) -> tensor<?x64xbf16>
  %1 = moe.combine %e, %rows : (tensor<?x64xbf16>, tensor<?x2xi32>) -> tensor<?x64xbf16>
  return %0, %1 : tensor<?x64xbf16>, tensor<?x64xbf16>
}

// CHECK-LABEL: func @expert_parallel
// CHECK: moe.ep_dispatch_send %{{[^ ,)]+}}, %{{[^ ,)]+}} scale %{{[^ ,)]+}} {local_experts = 2 : i64}
// CHECK: moe.ep_dispatch_recv %{{[^ ,)]+}} {scaled}
// CHECK: moe.ep_combine_send %{{[^ ,)]+}}, %{{[^ ,)]+}} :
// CHECK: moe.ep_combine_recv %{{[^ ,)]+}}, %{{[^ ,)]+}} :
func.func @expert_parallel(%x: tensor<?x64xbf16>, %ids: tensor<?x2xi32>, %w: tensor<?x2xf32>) -> tensor<?x64xbf16> {
  %sent, %rows = moe.ep_dispatch_send %x, %ids scale %w {local_experts = 2 : i64} : (tensor<?x64xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent {scaled} : (tensor<2xi32>) -> (tensor<?x64xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  %back = moe.ep_combine_send %d, %origin : (tensor<?x64xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  %g = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x64xbf16>
  return %g : tensor<?x64xbf16>
}

// The backward's exchanges: rows with their weights, home with a value each.
// CHECK-LABEL: func @expert_parallel_backward
// CHECK: moe.ep_dispatch_recv %{{[^ ,)]+}} {weights}
// CHECK: moe.activation_grad %{{[^ ]+}}, %{{[^ ]+}} gate %{{[^ ]+}} {activation = #moe.activation<kind = swiglu>, linear_gate}
// CHECK: moe.ep_combine_send %{{[^ ,)]+}}, %{{[^ ,)]+}} values %{{[^ ,)]+}} :
// CHECK: moe.ep_combine_recv %{{[^ ,)]+}}, %{{[^ ,)]+}} : (tensor<2xi32>, tensor<?x2xi32>) -> (tensor<?x16xbf16>, tensor<?x2xf32>)
func.func @expert_parallel_backward(%dy: tensor<?x16xbf16>, %ids: tensor<?x2xi32>, %w: tensor<?x2xf32>, %h: tensor<?x16xbf16>, %g: tensor<?x8xbf16>) -> (tensor<?x16xbf16>, tensor<?x2xf32>) {
  %sent, %rows = moe.ep_dispatch_send %dy, %ids scale %w {local_experts = 2 : i64} : (tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin, %rw = moe.ep_dispatch_recv %sent {weights} : (tensor<2xi32>) -> (tensor<?x16xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>, tensor<?x1xf32>)
  %dh, %aw, %dw = moe.activation_grad %g, %h gate %rw {activation = #moe.activation<kind = swiglu>, linear_gate} : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x1xf32>) -> (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<?x1xf32>)
  %back = moe.ep_combine_send %dh, %origin values %dw : (tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x1xf32>) -> tensor<2xi32>
  %home, %dwt = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> (tensor<?x16xbf16>, tensor<?x2xf32>)
  return %home, %dwt : tensor<?x16xbf16>, tensor<?x2xf32>
}

// The training ops (moe-differentiate).
// CHECK-LABEL: func @training_ops
// CHECK: moe.activation %{{[^ ]+}} {activation = #moe.activation<kind = swiglu>} : (tensor<?x16xbf16>) -> tensor<?x8xbf16>
// CHECK: moe.activation_grad %{{[^ ]+}}, %{{[^ ]+}} rows(%{{[^ ]+}}, %{{[^ ]+}}) bias_term %{{[^ ]+}} {activation = #moe.activation<kind = swiglu>}
// CHECK: moe.activation_grad %{{[^ ]+}}, %{{[^ ]+}} gate %{{[^ ]+}} {activation = #moe.activation<kind = swiglu>}
// CHECK: moe.grouped_matmul_dgrad %{{[^ ]+}}, %{{[^ ]+}} groups(%{{[^ ]+}}, %{{[^ ]+}}) bias %{{[^ ]+}} :
// CHECK: moe.grouped_matmul_dgrad %{{[^ ]+}}, %{{[^ ]+}} groups(%{{[^ ]+}}, %{{[^ ]+}}) acc %{{[^ ]+}} :
// CHECK: moe.grouped_matmul_wgrad %{{[^ ]+}} lhs %{{[^ ]+}} groups(%{{[^ ]+}}, %{{[^ ]+}}) : {{.*}} -> tensor<4x8x16xf32>
// CHECK: moe.grouped_matmul_wgrad %{{[^ ]+}} groups(%{{[^ ]+}}, %{{[^ ]+}}) : {{.*}} -> tensor<4x8xf32>
// CHECK: moe.grouped_matmul_wgrad %{{[^ ]+}} lhs %{{[^ ]+}} groups(%{{[^ ]+}}, %{{[^ ]+}}) scale %{{[^ ]+}} {quant = #moe.quant<kind = fp8_block128>} : {{.*}} -> tensor<4x8x16xf32>
// CHECK: moe.route_grad %{{[^ ]+}}, %{{[^ ]+}} bias %{{[^ ]+}} choices(%{{[^ ]+}}, %{{[^ ]+}}) {router = #moe.router<kind = topk_softmax>}
// CHECK: moe.route_grad %{{[^ ]+}}, %{{[^ ]+}} logits %{{[^ ]+}} choices(%{{[^ ]+}}, %{{[^ ]+}}) {router = #moe.router<kind = softmax_topk>}
// CHECK: moe.gather_dot %{{[^ ]+}}, %{{[^ ]+}} rows %{{[^ ]+}} : (tensor<?x16xbf16>, tensor<?x16xbf16>, tensor<?x2xi32>) -> tensor<?x2xf32>
// CHECK: moe.gather_dot %{{[^ ]+}} : (tensor<?x2xf32>) -> tensor<?x1xf32>
func.func @training_ops(%h: tensor<?x16xbf16>, %g: tensor<?x8xbf16>,
                        %rows: tensor<?x2xi32>, %w: tensor<?x2xf32>,
                        %bt: tensor<?x1xf32>, %gate: tensor<?x1xbf16>,
                        %dy: tensor<?x16xbf16>, %w2: tensor<4x16x8xbf16>,
                        %c: tensor<4xi32>, %o: tensor<5xi32>,
                        %b2: tensor<4x16xbf16>, %acc: tensor<?x8xf32>,
                        %x: tensor<?x16xbf16>, %wr: tensor<4x16xbf16>,
                        %br: tensor<4xf32>, %ids: tensor<?x2xi32>,
                        %dw: tensor<?x2xf32>, %logits: tensor<?x4xf32>,
                        %q: tensor<?x16xf8E4M3FN>, %qs: tensor<?x1xf32>) {
  %a = moe.activation %h {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x16xbf16>) -> tensor<?x8xbf16>
  %dh, %aw, %dwr = moe.activation_grad %g, %h rows(%rows, %w) bias_term %bt
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x2xi32>, tensor<?x2xf32>,
         tensor<?x1xf32>) -> (tensor<?x16xbf16>, tensor<?x8xbf16>,
                               tensor<?x2xf32>)
  %dh2, %aw2, %dg = moe.activation_grad %g, %h gate %gate
      {activation = #moe.activation<kind = swiglu>}
      : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<?x1xbf16>)
      -> (tensor<?x16xbf16>, tensor<?x8xbf16>, tensor<?x1xf32>)
  %gr, %bd = moe.grouped_matmul_dgrad %dy, %w2 groups(%c, %o) bias %b2
      : (tensor<?x16xbf16>, tensor<4x16x8xbf16>, tensor<4xi32>, tensor<5xi32>,
         tensor<4x16xbf16>) -> (tensor<?x8xbf16>, tensor<?x1xf32>)
  %d = moe.grouped_matmul_dgrad %dy, %w2 groups(%c, %o) acc %acc
      : (tensor<?x16xbf16>, tensor<4x16x8xbf16>, tensor<4xi32>, tensor<5xi32>,
         tensor<?x8xf32>) -> tensor<?x8xf32>
  %dw2 = moe.grouped_matmul_wgrad %a lhs %dy groups(%c, %o)
      : (tensor<?x8xbf16>, tensor<?x16xbf16>, tensor<4xi32>, tensor<5xi32>)
      -> tensor<4x8x16xf32>
  %db = moe.grouped_matmul_wgrad %a groups(%c, %o)
      : (tensor<?x8xbf16>, tensor<4xi32>, tensor<5xi32>) -> tensor<4x8xf32>
  %dwq = moe.grouped_matmul_wgrad %a lhs %q groups(%c, %o) scale %qs
      {quant = #moe.quant<kind = fp8_block128>}
      : (tensor<?x8xbf16>, tensor<?x16xf8E4M3FN>, tensor<4xi32>, tensor<5xi32>,
         tensor<?x1xf32>) -> tensor<4x8x16xf32>
  %dl = moe.route_grad %x, %wr bias %br choices(%ids, %dw)
      {router = #moe.router<kind = topk_softmax>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<4xf32>, tensor<?x2xi32>,
         tensor<?x2xf32>) -> tensor<?x4xf32>
  %dl2 = moe.route_grad %x, %wr logits %logits choices(%ids, %dw)
      {router = #moe.router<kind = softmax_topk>}
      : (tensor<?x16xbf16>, tensor<4x16xbf16>, tensor<?x4xf32>, tensor<?x2xi32>,
         tensor<?x2xf32>) -> tensor<?x4xf32>
  %gd = moe.gather_dot %dy, %x rows %ids
      : (tensor<?x16xbf16>, tensor<?x16xbf16>, tensor<?x2xi32>) -> tensor<?x2xf32>
  %rs = moe.gather_dot %dw : (tensor<?x2xf32>) -> tensor<?x1xf32>
  return
}

// -----

// CHECK-LABEL: func.func @quantized_activation
// CHECK: moe.activation %arg0 {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = mxfp8>} : (tensor<?x128xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
func.func @quantized_activation(%h: tensor<?x128xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>) {
  %a, %s = moe.activation %h {activation = #moe.activation<kind = swiglu>, quant = #moe.quant<kind = mxfp8>} : (tensor<?x128xbf16>) -> (tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>)
  return %a, %s : tensor<?x64xf8E4M3FN>, tensor<?x2xf8E8M0FNU>
}
