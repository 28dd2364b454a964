// Input for function-length.test: a short and a long function, braces in
// comments and literals, a lambda, a class with a method, a namespace.
#include <string>

namespace outer {

static int shortOne(int x) {
  // A brace in a comment: {
  const char *s = "}{";
  char c = '{';
  return x + s[0] + c;
}

int longOne(int x) {
  auto twice = [&](int y) {
    return 2 * y;
  };
  /* A block comment with a brace }
     over two lines. */
  std::string raw = R"(}}})";
  int sum = 0;
  for (int i = 0; i < x; ++i) {
    sum += twice(i);
  }
  return sum + int(raw.size());
}

class Holder {
public:
  int method(int x) {
    int y = x;
    y += 1;
    y += 2;
    y += 3;
    return y;
  }
};

} // namespace outer

int
Holder2Like(int x,
            int y) {
  return x + y;
}

extern "C" {
int cEntry(int x) {
  int y = x;
  y += 1;
  return y;
}
}
