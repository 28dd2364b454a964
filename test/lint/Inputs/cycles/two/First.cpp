#include "test/lint/Inputs/cycles/two/Shared.h"

using namespace fixture::two;

int two::first(int x) { return x > 0 ? second(x - 1) : 0; }
