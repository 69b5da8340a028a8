// Dense copies of small 2:4 weights (kernels.h, kSmallLayerBytes), in f32 or bf16: made once per
// weight and dtype, remade when its values, meta or scales change (their storage, data pointer or
// version), all of them together within kDenseCopyBudget bytes. A copy lives until its weight's
// values are freed.
#include <map>
#include <memory>
#include <mutex>

#include "cpu/cpu.h"
#include "cpu/sparse24/dense_copy.h"
#include "cpu/sparse24/kernels.h"

namespace sinter::sparse {
namespace {

struct Source {
  std::weak_ptr<Storage> storage;
  const void* data = nullptr;
  uint64_t version = 0;
  bool same(const Tensor& t) const {
    return data == t.data_ptr() && version == t.version() && !storage.owner_before(t.storage()) &&
           !t.storage().owner_before(storage);
  }
};

struct Entry {
  Source from[3];
  Tensor dense;
  int64_t bytes = 0;
};

struct Cache {
  std::mutex mu;
  std::map<std::pair<const Storage*, DType>, Entry> entries;  // by the values' storage and the copy's dtype
  int64_t bytes = 0;
  void purge() {  // copies whose weights are gone
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.from[0].storage.expired()) bytes -= it->second.bytes, it = entries.erase(it);
      else ++it;
    }
  }
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: weights freed at exit still find it
  return *c;
}

}  // namespace

Tensor dense_copy(const Tensor& values, const Tensor& meta, const Tensor& scales, DType dt) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  const Tensor* parts[3] = {&values, &meta, &scales};
  const std::pair<const Storage*, DType> key{values.storage().get(), dt};
  auto it = c.entries.find(key);
  if (it != c.entries.end()) {
    bool same = true;
    for (int i = 0; i < 3 && same; ++i) same = it->second.from[i].same(*parts[i]);
    if (same) return it->second.dense;
  }
  c.purge();  // before a new copy counts against the budget (a hit needs no purge)
  it = c.entries.find(key);
  const int64_t N = values.size(0), K = values.size(1) * 2;
  const int64_t held = it != c.entries.end() ? it->second.bytes : 0;
  if (c.bytes - held + N * K * dtype_size(dt) > kDenseCopyBudget) {  // no room: this weight runs the 2:4 kernels
    if (it != c.entries.end()) c.bytes -= held, c.entries.erase(it);
    return {};
  }
  Tensor v = cpu::contiguous_as(values, values.dtype()), m = cpu::contiguous_as(meta, DType::u8),
         s = cpu::contiguous_as(scales, DType::f32);
  Tensor d = Tensor::empty({N, K}, DType::f32);
  to_dense<float>(v.data_ptr(), v.dtype(), m.data<uint8_t>(), s.data<float>(), N, K, d.data<float>());
  if (dt == DType::bf16) {  // only where exact: a column meta names twice holds a sum bf16 may not
    Tensor h = cpu::contiguous_as(d, DType::bf16);
    const float* f = d.data<float>();
    const bf16* b = h.data<bf16>();
    bool exact = true;
    for (int64_t i = 0; i < N * K && exact; ++i) exact = float(b[i]) == f[i];
    if (exact) d = h;
  }
  const int64_t bytes = N * K * dtype_size(d.dtype());
  Entry& e = c.entries[key];
  c.bytes += bytes - e.bytes;
  e.bytes = bytes;
  e.dense = d;
  for (int i = 0; i < 3; ++i) e.from[i] = {parts[i]->storage(), parts[i]->data_ptr(), parts[i]->version()};
  return e.dense;
}

DType dense_copy_dtype(DType x, DType values) {
  return x == DType::bf16 && values == DType::bf16 && cpu::dnnl_has_bf16() ? DType::bf16 : DType::f32;
}

int64_t dense_copy_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.purge();
  return c.bytes;
}

}  // namespace sinter::sparse
