// Every kernel the CPU folder has, registered in one call through detail::add_kernel: into the
// library's op table (src/library.cpp) or the runtime's registry by op name (src/runtime/kernels.cpp).
namespace sinter::detail {
void register_attention_kernels();  // cpu/attention/sdpa_cpu.cpp
}
namespace sinter::sparse {
void register_sparse_kernels();  // cpu/sparse24/linear_cpu.cpp
}

namespace sinter::cpu {

void register_elementwise_kernels();
void register_inplace_kernels();
void register_factory_kernels();
void register_data_kernels();
void register_shape_kernels();
void register_reduce_kernels();
void register_linalg_kernels();
void register_nn_kernels();
void register_index_kernels();
void register_optimizer_kernels();

void register_all_kernels() {
  register_elementwise_kernels();
  register_inplace_kernels();
  register_factory_kernels();
  register_data_kernels();
  register_shape_kernels();
  register_reduce_kernels();
  register_linalg_kernels();
  register_nn_kernels();
  register_index_kernels();
  register_optimizer_kernels();
  detail::register_attention_kernels();
  sparse::register_sparse_kernels();
}

}  // namespace sinter::cpu
