// The library calls of a program (runtime/executor.h), shared by the JIT and the runtime.
#include "runtime/executor.h"

#include "cpu/cpu.h"

namespace sinter::runtime {

void run_extern(ExternCall& c) {
  (*c.kernel)(c.in, c.out, *c.attrs);
  for (size_t k = 0; k < c.writes.size(); ++k)
    if (c.writes[k]) ++c.out[k].storage()->version;
}

namespace {
void describe(const Tensor& t, std::vector<int64_t>& q) {  // ndim, sizes, strides
  q.push_back(t.dim());
  for (int64_t s : t.shape()) q.push_back(s);
  for (int64_t s : t.strides()) q.push_back(s);
}
}  // namespace

void user_kernel_operands(std::span<const Tensor> in, std::span<Tensor> out, const std::vector<bool>& written, std::vector<char*>& p,
                          std::vector<int64_t>& q, std::vector<Tensor>& keep) {
  keep.reserve(in.size());  // (references into it stay valid)
  for (size_t i = 0; i < in.size(); ++i) {
    const Tensor& x = written[i] || in[i].is_contiguous() ? in[i] : keep.emplace_back(cpu::contiguous_as(in[i], in[i].dtype()));
    p.push_back(static_cast<char*>(x.data_ptr()));
    describe(x, q);
  }
  for (Tensor& y : out) p.push_back(static_cast<char*>(y.data_ptr())), describe(y, q);
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
