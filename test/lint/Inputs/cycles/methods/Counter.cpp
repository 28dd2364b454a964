#include "test/lint/Inputs/cycles/methods/Counter.h"

using namespace fixture;

void Counter::add(int x) {
  value += x;
  print();
}
