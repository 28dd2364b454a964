#include "test/lint/Inputs/cycles/two/Shared.h"

namespace fixture::two {

int second(int x) {
  return first(x) + 1;
}

} // namespace fixture::two
