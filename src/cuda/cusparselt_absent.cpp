// cusparselt.h where libsinter_cuda is built without cuSPARSELt's header: no weight is compressed,
// and 2:4 layers run their dense copies.
#include "cuda/cusparselt.h"

namespace sinter::cuda {

struct SparseGemm {};

std::string cusparselt_why_not() {
  return "this libsinter_cuda was built without cuSPARSELt's header (scripts/fetch_cuda_headers.sh fetches it)";
}
std::shared_ptr<SparseGemm> cusparselt_compress(const Tensor&) { SINTER_THROW(Error, "[sparse24_linear] ", cusparselt_why_not()); }
void cusparselt_matmul(SparseGemm&, const Tensor&, const Tensor&) { SINTER_THROW(Error, "[sparse24_linear] ", cusparselt_why_not()); }

}  // namespace sinter::cuda
