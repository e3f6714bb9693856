// CPU check of split-KV's merge (kernel_src/sm90/split_merge.cuh), built with -DFT_KV_SPLITS=S: reads
// rows of S partials from stdin and merges each as the kernel's epilogue does (merge_splits: O =
// sum_s weight(LSE_s) O_s, LSE = the merge's lse); tests/kernels/test_split_kv.py compares the result with
// a softmax over all the row's keys.
//
// stdin: ROWS DIM, then per row S LSEs and S x DIM values of O (split-major); "-inf" for a split without keys.
// stdout: per row its LSE and DIM values of O, one row a line.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm90/split_merge.cuh"

using namespace ft_sm90;

static float read_float() {
  char text[64];
  if (std::scanf("%63s", text) != 1) std::exit(2);
  return std::strtof(text, nullptr);  // accepts "-inf"
}

int main() {
  int rows = 0, dim = 0;
  if (std::scanf("%d %d", &rows, &dim) != 2) return 2;
  std::vector<float> lse(kKvSplits), o(static_cast<size_t>(kKvSplits) * dim);
  for (int r = 0; r < rows; ++r) {
    for (float& x : lse) x = read_float();
    for (float& x : o) x = read_float();
    const SplitMerge merge([&](int s) { return lse[s]; });
    std::printf("%.9g", merge.lse);
    for (int d = 0; d < dim; ++d) {
      float out = 0.f;
      for (int s = 0; s < kKvSplits; ++s) out += merge.weight(lse[s]) * o[static_cast<size_t>(s) * dim + d];
      std::printf(" %.9g", out);
    }
    std::printf("\n");
  }
  return 0;
}
