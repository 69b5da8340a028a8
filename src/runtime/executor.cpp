// The library calls of a program (runtime/executor.h), shared by the JIT and the runtime.
#include "runtime/executor.h"

namespace sinter::runtime {

void run_extern(ExternCall& c) {
  (*c.kernel)(c.in, c.out, *c.attrs);
  for (size_t k = 0; k < c.writes.size(); ++k)
    if (c.writes[k]) ++c.out[k].storage()->version;
}

void describe(const Tensor& t, std::vector<int64_t>& q) {
  q.push_back(t.dim());
  for (int64_t s : t.shape()) q.push_back(s);
  for (int64_t s : t.strides()) q.push_back(s);
}

void SlotStorage::resize(size_t n) {
  while (storage.size() < n) {
    auto s = std::make_shared<Storage>();
    s->device = Device{};
    storage.push_back(std::move(s));
  }
}

void SlotStorage::set(size_t slot, void* data, int64_t nbytes, char** table) {
  storage[slot]->data = data;
  storage[slot]->nbytes = nbytes;
  table[slot] = static_cast<char*>(data);
}

}  // namespace sinter::runtime
