// y = silu(gate) * up, elementwise over contiguous tensors: what LLaMA's MLP computes between its
// gate/up projections and its down projection, one pass instead of two. Cfg::BLOCK elements per
// task of the thread team; both configs are compiled and the faster is kept per key bucket.
template <class Cfg> void kernel(sinter::In<float> gate, sinter::In<float> up, auto& y) {
  const int64_t n = y.numel(), blocks = (n + Cfg::BLOCK - 1) / Cfg::BLOCK;
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = (b + 1) * Cfg::BLOCK < n ? (b + 1) * Cfg::BLOCK : n;
#pragma omp simd
    for (int64_t i = b * Cfg::BLOCK; i < end; ++i) y.store(i, sinter::fn::Silu{}(gate[i]) * up[i]);
  }
}
