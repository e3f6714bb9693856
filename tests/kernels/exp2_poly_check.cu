// CPU check of ft_common::exp2_poly (kernel_src/common/convert.cuh) against double-precision exp2:
// relative error over the softmax's range, exact +0 for masked (-inf) and very small arguments.
// Prints "ok <max relative error>" and exits 0, or the first violation and exits 1.
#include <cmath>
#include <cstdio>

#include "common/convert.cuh"

int main() {
  double worst = 0.0;
  for (double x = -126.0; x <= 8.0; x += 1.0 / 4096 + 1e-9) {  // 548864 points, off the grid of halves
    const float xf = static_cast<float>(x);
    const double got = ft_common::exp2_poly(xf), want = std::exp2(static_cast<double>(xf));
    const double rel = std::fabs(got / want - 1.0);
    if (!(rel <= 1.1e-4)) {
      std::printf("FAIL x=%.9g got %.9g want %.9g rel %.3g\n", xf, got, want, rel);
      return 1;
    }
    if (rel > worst) worst = rel;
  }
  const float zeros[] = {-INFINITY, -126.0001f, -127.0f, -200.0f, -1e30f};
  for (float x : zeros)
    if (ft_common::exp2_poly(x) != 0.0f || std::signbit(ft_common::exp2_poly(x))) {
      std::printf("FAIL x=%g gives %g, not +0\n", x, ft_common::exp2_poly(x));
      return 1;
    }
  if (ft_common::exp2_poly(0.0f) != 1.0f) {
    std::printf("FAIL 2^0 = %.9g\n", ft_common::exp2_poly(0.0f));
    return 1;
  }
  std::printf("ok %.3g\n", worst);
  return 0;
}
