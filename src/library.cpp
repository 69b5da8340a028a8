// Everything the library puts in the op table, listed once: each layer's op definitions, then the
// kernels each device folder registers for them. The registry runs this once, on first use
// (explicitly, so no op is lost to static initialisation order or to the linker dropping an
// object file).
namespace sinter::detail {
void register_elementwise_ops();    // ops/elementwise.cpp
void register_inplace_ops();        // ops/inplace.cpp
void register_factory_ops();        // ops/factory.cpp
void register_data_ops();           // ops/tensor_data.cpp
void register_shape_ops();          // ops/shape.cpp
void register_position_ops();       // ops/positions.cpp
void register_reduce_ops();         // ops/reduce.cpp
void register_linalg_ops();         // ops/linalg.cpp
void register_nn_ops();             // ops/nn.cpp
void register_index_ops();          // ops/index.cpp
void register_optimizer_ops();      // optim/update_ops.cpp
void register_attention_ops();      // attention/sdpa.cpp
void register_sparse_ops();         // sparse/semi_structured.cpp
}  // namespace sinter::detail

namespace sinter::cpu {
void register_all_kernels();  // cpu/register.cpp: every CPU kernel (the runtime's registry takes them too)
}
namespace sinter::dist {
void register_dist_ops();            // distributed/ops.cpp
void register_collective_kernels();  // distributed/collective_kernels.cpp
}

namespace sinter::detail {

void register_library() {
  register_elementwise_ops();
  register_inplace_ops();
  register_factory_ops();
  register_data_ops();
  register_shape_ops();
  register_position_ops();
  register_reduce_ops();
  register_linalg_ops();
  register_nn_ops();
  register_index_ops();
  register_optimizer_ops();
  register_attention_ops();
  register_sparse_ops();
  dist::register_dist_ops();

  cpu::register_all_kernels();
  dist::register_collective_kernels();
}

}  // namespace sinter::detail
