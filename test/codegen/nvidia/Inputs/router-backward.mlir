// The router's backward: the logits' gradient from the weights' gradient
// (route_grad, a softmax over 16 experts), then the router weight's
// gradient, a product of the f32 logit gradient that runs on CUDA cores.
func.func @router_backward(%x: tensor<?x96xbf16>, %wr: tensor<16x96xbf16>,
                           %ids: tensor<?x4xi32>, %dw: tensor<?x4xf32>)
    -> tensor<16x96xf32> {
  %dl = moe.route_grad %x, %wr choices(%ids, %dw)
      {router = #moe.router<kind = softmax_topk, renormalize = true>}
      : (tensor<?x96xbf16>, tensor<16x96xbf16>, tensor<?x4xi32>,
         tensor<?x4xf32>) -> tensor<?x16xf32>
  %dwr = moe.grouped_matmul_wgrad %dl lhs %x
      : (tensor<?x16xf32>, tensor<?x96xbf16>) -> tensor<16x96xf32>
  return %dwr : tensor<16x96xf32>
}
