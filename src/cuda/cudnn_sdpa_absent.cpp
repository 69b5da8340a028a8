// cudnn_sdpa.h where libsinter_cuda is built without cudnn-frontend's headers: cuDNN runs no call,
// and the flash kernels run them all.
#include "cuda/cudnn_sdpa.h"

namespace sinter::cuda {

bool cudnn_sdpa_forward(const detail::Geometry&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&) {
  return false;
}
bool cudnn_sdpa_backward(const detail::Geometry&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, std::span<Tensor>) {
  return false;
}
std::string cudnn_sdpa_why_not(const detail::Geometry&, DType) {
  return "this libsinter_cuda was built without cudnn-frontend's headers (scripts/fetch_cuda_headers.sh fetches them)";
}

}  // namespace sinter::cuda
