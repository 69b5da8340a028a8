#pragma once
// The 2:4 rule of one group of four weights, shared by every device's kernel of the
// sparse24_select op (src/sparse/semi_structured.cpp): keep the two largest |w|, the earlier on
// ties. A group with at most two nonzeros so keeps its nonzeros and, where it has fewer, its first
// zeros. Returns meta's nibble of the kept columns: first | second << 2, first < second.
#include <cstdint>

#ifndef SINTER_HD
#define SINTER_HD
#endif

namespace sinter::sparse {

template <class T> SINTER_HD inline T magnitude(T v) { return v < T(0) ? -v : v; }

template <class T> SINTER_HD inline uint8_t keep_two_of_four(const T* q) {
  int a = 0;
  for (int i = 1; i < 4; ++i)
    if (magnitude(q[i]) > magnitude(q[a])) a = i;
  int b = a == 0 ? 1 : 0;
  for (int i = b + 1; i < 4; ++i)
    if (i != a && magnitude(q[i]) > magnitude(q[b])) b = i;
  return uint8_t(a < b ? a | b << 2 : b | a << 2);
}

}  // namespace sinter::sparse
