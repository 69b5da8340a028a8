// Writes x (B, H, T, D) into a KV cache (B, H, L, D) at position pos along dim 2, in place: the
// cache is input 0 and, written, output 0 (Effect::writes(0)). Any strides (cache(b, h, t, d)).
template <class Cfg> void kernel(sinter::In<float> cache_in, sinter::In<float> x, sinter::In<int64_t> pos, auto& cache) {
  (void)cache_in;  // the same tensor as `cache`, read-only
  const int64_t p = pos[0];
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t t = 0; t < x.size(2); ++t)
        for (int64_t d = 0; d < x.size(3); ++d) cache(b, h, p + t, d) = x(b, h, t, d);
}
