// Calls Low.cpp's functions. Its own `tally` and `scale` are not the ones
// Kernels.h declares (a static at file scope, one in an anonymous
// namespace, one in another namespace, a method), so Low.cpp's calls do
// not come here.
#include "test/lint/Inputs/cycles/acyclic/High.h"
#include "test/lint/Inputs/cycles/acyclic/Kernels.h"
#include "test/lint/Inputs/cycles/acyclic/Low.h"

static int tally(int x) { return x - 1; }

namespace fixture {
namespace {
int scale(int x) { return 3 * x; }
} // namespace
} // namespace fixture

namespace other {
int scale(int x) { return 4 * x; }
} // namespace other

struct Local {
  int tally(int x) { return x; }
};

namespace fixture {

int buildHigh(int x) {
  Table t{x};
  return buildLow(x) + t.size() + lowest(x) + ::tally(x);
}

int highest(int x) { return buildHigh(x); }

} // namespace fixture
