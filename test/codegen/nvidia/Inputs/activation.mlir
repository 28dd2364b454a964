// The training forward's activation step on its own.
func.func @activation(%h: tensor<?x128xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.activation %h {activation = #moe.activation<kind = clamped_swiglu,
                                                        alpha = 1.702,
                                                        limit = 7.0>}
      : (tensor<?x128xbf16>) -> tensor<?x64xbf16>
  return %0 : tensor<?x64xbf16>
}
