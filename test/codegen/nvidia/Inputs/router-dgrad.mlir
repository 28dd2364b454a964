// The hidden states' gradient through the router: the f32 logit gradient
// times the router weights, added to the shared experts' f32 gradient.
func.func @router_dgrad(%dl: tensor<?x16xf32>, %wr: tensor<16x96xbf16>,
                        %acc: tensor<?x96xf32>) -> tensor<?x96xf32> {
  %dx = moe.grouped_matmul_dgrad %dl, %wr acc %acc
      : (tensor<?x16xf32>, tensor<16x96xbf16>, tensor<?x96xf32>)
      -> tensor<?x96xf32>
  return %dx : tensor<?x96xf32>
}
