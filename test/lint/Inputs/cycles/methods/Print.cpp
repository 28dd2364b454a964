#include "test/lint/Inputs/cycles/methods/Counter.h"

#include <cstdio>

using namespace fixture;

void Counter::print() const { std::printf("%d\n", total()); }
