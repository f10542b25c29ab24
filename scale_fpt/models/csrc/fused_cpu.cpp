// Fused CPU kernels for the element-wise parts of a GPT-2 training step (scale_fpt.models.ops).
//
// torch runs GPT-2's tanh-GELU as a tanh-bound kernel and dropout as a Mersenne-Twister
// draw per element, a float mask and a product; these kernels do each in one pass:
//
//   gelu_forward(x) -> x * sigmoid(u),  u = C x (1 + A x^2)   (= 0.5 x (1 + tanh(u / 2)))
//   gelu_backward(g, x) -> g * d/dx[x sigmoid(u)]             (sigmoid recomputed from x)
//   dropout_add(h, x, p, seeds, rows, total_rows) -> h + x * keep_i / (1 - p)   (h optional)
//
// x is split into len(seeds) equal consecutive chunks (one per member of a packed cohort);
// keep_i of element i = c * chunk + j is drawn from a counter-based generator: SplitMix64's
// output for state ``seeds[c]`` at step j + 1, kept when its top 32 bits are >=
// round(p * 2^32). The mask of a chunk is a function of (its seed, j) alone: the same as
// that member's mask when it runs alone, recomputed by the backward pass instead of stored,
// and independent of the number of threads. With ``rows``, x holds some rows of a logical
// (total_rows, width) tensor: its row r is logical row L = rows[r], whose element c is draw
// (L mod rows_per_seed) * width + c of seed L div rows_per_seed (rows_per_seed =
// total_rows / len(seeds)), so computing only some rows draws what the whole tensor draws
// there (keyed_random.keep_mask_rows).
//
// Loops are branch-free so the compiler vectorises them; target_clones builds AVX-512 and
// AVX2 versions beside the baseline, chosen at load time for the machine it runs on.

// The headers these kernels use, not <torch/extension.h> (all of torch's C++ API): the
// build compiles in about half the time (15 s against 27 s of CPU, once per node).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr float kGeluC = 1.5957691216057308f;  // 2 sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr int64_t kGrain = 16384;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SCALE_FPT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else  // other compilers and CPUs: one build for the compiler's default target
#define SCALE_FPT_CLONES
#endif

inline float bits_to_float(int32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// exp(x) to ~2 ulp (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, degree-6 polynomial).
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // round to nearest: the float-to-int conversion truncates, so shift to positive first
  float n = static_cast<float>(static_cast<int32_t>(x * 1.44269504088896341f + 128.5f) - 128);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bits_to_float((static_cast<int32_t>(n) + 127) << 23);
}

inline float sigmoid(float u) { return 1.0f / (1.0f + exp_approx(-u)); }

SCALE_FPT_CLONES
void gelu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = v * sigmoid(kGeluC * v * (1.0f + kGeluA * v * v));
  }
}

SCALE_FPT_CLONES
void gelu_backward_kernel(const float* g, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float v2 = v * v;
    float s = sigmoid(kGeluC * v * (1.0f + kGeluA * v2));
    float du = kGeluC * (1.0f + 3.0f * kGeluA * v2);
    dx[i] = g[i] * (s + v * s * (1.0f - s) * du);
  }
}

inline uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

SCALE_FPT_CLONES
void dropout_add_kernel(const float* h, const float* x, float* out, int64_t n,
                        int64_t first_draw, uint64_t seed, uint64_t threshold, float scale) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t draw = splitmix64(seed, static_cast<uint64_t>(first_draw + i)) >> 32;
    float keep = draw >= threshold ? scale : 0.0f;
    out[i] = (h ? h[i] : 0.0f) + x[i] * keep;
  }
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
}

at::Tensor gelu_forward(const at::Tensor& x) {
  check(x, "x");
  auto y = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    gelu_forward_kernel(src + begin, dst + begin, end - begin);
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& g, const at::Tensor& x) {
  check(g, "grad");
  check(x, "x");
  TORCH_CHECK(g.numel() == x.numel(), "grad and x differ in size");
  auto dx = at::empty_like(x);
  const float* gp = g.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* out = dx.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    gelu_backward_kernel(gp + begin, xp + begin, out + begin, end - begin);
  });
  return dx;
}

at::Tensor dropout_add(const c10::optional<at::Tensor>& h, const at::Tensor& x, double p,
                       const std::vector<int64_t>& seeds, const c10::optional<at::Tensor>& rows,
                       int64_t total_rows) {
  check(x, "x");
  const int64_t chunks = static_cast<int64_t>(seeds.size());
  TORCH_CHECK(chunks > 0 && x.numel() % chunks == 0, "x of ", x.numel(),
              " elements does not split into ", chunks, " equal chunks");
  const int64_t chunk = x.numel() / chunks;
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  const float* hp = nullptr;
  if (h.has_value()) {
    check(*h, "h");
    TORCH_CHECK(h->numel() == x.numel(), "h and x differ in size");
    hp = h->data_ptr<float>();
  }
  const uint64_t threshold = static_cast<uint64_t>(std::llround(p * 4294967296.0));
  const float scale = static_cast<float>(4294967296.0 / (4294967296.0 - threshold));
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (rows.has_value()) {
    TORCH_CHECK(rows->device().is_cpu() && rows->scalar_type() == at::kLong && rows->is_contiguous(),
                "rows must be a contiguous int64 CPU tensor");
    const int64_t n_rows = rows->numel();
    TORCH_CHECK(n_rows > 0 && x.numel() % n_rows == 0 && total_rows % chunks == 0,
                "x does not split into rows, or the logical rows into one chunk per seed");
    const int64_t width = x.numel() / n_rows;
    const int64_t rows_per_seed = total_rows / chunks;
    const int64_t* rp = rows->data_ptr<int64_t>();
    const int64_t grain = std::max<int64_t>(1, kGrain / width);
    at::parallel_for(0, n_rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; r++) {
        const int64_t row = rp[r], offset = r * width;
        dropout_add_kernel(hp ? hp + offset : nullptr, xp + offset, op + offset, width,
                           (row % rows_per_seed) * width,
                           static_cast<uint64_t>(seeds[row / rows_per_seed]), threshold, scale);
      }
    });
    return out;
  }
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t offset = c * chunk;
    at::parallel_for(0, chunk, kGrain, [&](int64_t begin, int64_t end) {
      dropout_add_kernel(hp ? hp + offset + begin : nullptr, xp + offset + begin,
                         op + offset + begin, end - begin, begin,
                         static_cast<uint64_t>(seeds[c]), threshold, scale);
    });
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gelu_forward", &gelu_forward, "x sigmoid(u): GPT-2's tanh-GELU");
  m.def("gelu_backward", &gelu_backward, "gradient of gelu_forward");
  m.def("dropout_add", &dropout_add, "h + dropout(x) with a counter-based mask",
        pybind11::arg("h"), pybind11::arg("x"), pybind11::arg("p"), pybind11::arg("seeds"),
        pybind11::arg("rows") = pybind11::none(), pybind11::arg("total_rows") = 0);
}
