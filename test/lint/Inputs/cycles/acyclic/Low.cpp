// Includes the list, but names nothing of High.cpp's but in comments and
// literals: buildHigh(1), highest(2).
#include "test/lint/Inputs/cycles/acyclic/Kernels.h"
#include "test/lint/Inputs/cycles/acyclic/Low.h"
/* Not an include:
#include "test/lint/Inputs/cycles/acyclic/High.h"
*/

using namespace fixture;

int fixture::tally(int x) { return x + 1; }

namespace fixture {

int buildLow(int x) {
  const char *note = "buildHigh(x)";
  return tally(scale(x)) + note[0];
}

int scale(int x) { return 2 * x; }

int lowest(int x) { return x; }

} // namespace fixture

int Table::size() const { return rows; }
