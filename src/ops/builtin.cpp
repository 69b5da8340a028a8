// The built-in op table, registered once on first use (explicitly, so no op is lost to static
// initialisation order or to the linker dropping an object file).
namespace sinter::dist {
void register_dist_ops();
}

namespace sinter::detail {

void register_elementwise_ops();
void register_shape_ops();
void register_reduce_ops();
void register_linalg_ops();
void register_nn_ops();
void register_index_ops();
void register_flash_ops();
void register_sparse_ops();

void register_builtin_ops() {
  register_elementwise_ops();
  register_shape_ops();
  register_reduce_ops();
  register_linalg_ops();
  register_nn_ops();
  register_index_ops();
  register_flash_ops();
  register_sparse_ops();
  dist::register_dist_ops();
}

}  // namespace sinter::detail
