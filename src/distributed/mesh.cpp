// DeviceMesh: named dimensions over the world's ranks, one communicator per dimension.
#include <sstream>

#include "sinter/dist.h"

namespace sinter::dist {

DeviceMesh::DeviceMesh(const std::vector<std::pair<std::string, int64_t>>& dims) {
  auto w = world();
  int64_t total = 1;
  std::string desc;
  for (auto& [name, n] : dims) {
    SINTER_CHECK_T(DistError, n > 0, "[mesh] dimension '", name, "' has size ", n);
    for (auto& existing : names_)
      SINTER_CHECK_T(DistError, existing != name, "[mesh] dimension '", name, "' appears twice");
    names_.push_back(name), sizes_.push_back(n);
    total *= n;
    desc += (desc.empty() ? "" : " x ") + name + "=" + std::to_string(n);
  }
  SINTER_CHECK_T(DistError, !dims.empty() && total == w->size(), "[mesh] ", desc.empty() ? "no dimensions" : desc, " is ",
                 total, " ranks, but the job has ", w->size(), " (run under mpirun -np ", total, ")");
  // Row-major: the last dimension varies fastest over consecutive ranks.
  int64_t r = w->rank(), stride = total;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    stride /= sizes_[d];
    coords_.push_back(r / stride);
    r %= stride;
  }
  stride = total;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    stride /= sizes_[d];
    const int color = int(w->rank() - coords_[d] * stride);  // the rank with this coordinate zeroed: one per line
    groups_.push_back(w->split(color, int(coords_[d]), names_[d]));
  }
}

int64_t DeviceMesh::size() const {
  int64_t n = 1;
  for (int64_t s : sizes_) n *= s;
  return n;
}

int64_t DeviceMesh::index(const std::string& name) const {
  for (size_t d = 0; d < names_.size(); ++d)
    if (names_[d] == name) return int64_t(d);
  SINTER_THROW(DistError, "[mesh] no dimension '", name, "' in ", to_string());
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  const int64_t d = index(name);
  DeviceMesh m;
  m.names_ = {names_[size_t(d)]};
  m.sizes_ = {sizes_[size_t(d)]};
  m.coords_ = {coords_[size_t(d)]};
  m.groups_ = {groups_[size_t(d)]};
  return m;
}

DeviceMesh DeviceMesh::join(const DeviceMesh& inner) const {
  DeviceMesh m = *this;
  for (int64_t d = 0; d < inner.ndim(); ++d) {
    for (auto& n : names_) SINTER_CHECK_T(DistError, n != inner.name(d), "[mesh] joining two meshes that both have '", n, "'");
    m.names_.push_back(inner.names_[size_t(d)]), m.sizes_.push_back(inner.sizes_[size_t(d)]);
    m.coords_.push_back(inner.coords_[size_t(d)]), m.groups_.push_back(inner.groups_[size_t(d)]);
  }
  return m;
}

std::string DeviceMesh::to_string() const {
  std::ostringstream os;
  os << "DeviceMesh(";
  for (size_t d = 0; d < names_.size(); ++d) os << (d ? ", " : "") << names_[d] << "=" << sizes_[d];
  os << ")";
  return os.str();
}

}  // namespace sinter::dist
