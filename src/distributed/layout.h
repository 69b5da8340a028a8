#pragma once
// Parameter layouts (internal to src/distributed): the DTensor description tensor parallelism
// (parallel.cpp) and FSDP (fsdp.cpp) attach to each parameter they split, used to gather it for
// checkpoints and to count it once in norms; and the piece of a tensor a rank keeps.
#include <memory>
#include <optional>

#include "sinter/dist.h"

namespace sinter::dist::detail {

struct Layout {
  std::weak_ptr<TensorImpl> impl;
  DeviceMesh mesh;
  Placements placements;
  Shape global;
  bool fsdp = false;
};
void set_layout(const Tensor& p, Layout l);
std::optional<Layout> get_layout(const Tensor& p);  // nullopt for a parameter no split touched
// A fresh leaf holding this rank's piece of `full` along `dim` (split over `parts`).
Tensor piece(const Tensor& full, int64_t dim, int64_t parts, int64_t index);

}  // namespace sinter::dist::detail
