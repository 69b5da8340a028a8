// safetensors: validating parser (every field checked, offsets contiguous and in range, byte
// counts equal dtype x shape) over an mmap'd file, and an atomic writer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cpu/cpu.h"
#include "io/atomic_file.h"
#include "sinter/io.h"

namespace sinter::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation: 100 MB

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

#define ST_CHECK(cond, ...) SINTER_CHECK_T(IOError, cond, "[", name, "] ", __VA_ARGS__)

// A mapping shared by every tensor loaded from one file.
struct Mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
};

SafeTensors parse(const char* data, size_t size, const std::string& name, const std::shared_ptr<void>& keepalive) {
  ST_CHECK(size >= 8, "file is truncated: ", size, " bytes, too short for the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, data, 8);
  ST_CHECK(n <= kMaxHeader, "header length ", n, " exceeds the ", kMaxHeader, "-byte limit (corrupt or not safetensors)");
  ST_CHECK(n <= size - 8, "header length ", n, " runs past the end of the file (", size, " bytes): file truncated?");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    SINTER_THROW(IOError, "[", name, "] header is not valid JSON: ", e.what());
  }
  ST_CHECK(header.is_object(), "header must be a JSON object, got ", header.type_name());
  const uint64_t data_size = size - 8 - n;
  const char* base = data + 8 + n;

  SafeTensors out;
  std::vector<Entry> entries;
  for (auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      ST_CHECK(val.is_object(), "__metadata__ must be an object of strings");
      for (auto& [mk, mv] : val.items()) {
        ST_CHECK(mv.is_string(), "__metadata__ value for '", mk, "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    ST_CHECK(val.is_object(), "entry '", key, "' must be an object");
    Entry e{key, DType::f32, {}, 0, 0};
    auto dt = val.find("dtype");
    ST_CHECK(dt != val.end() && dt->is_string(), "entry '", key, "' has no dtype string");
    ST_CHECK(dtype_from_safetensors_name(dt->get<std::string>(), &e.dtype), "entry '", key, "' has unsupported dtype '",
             dt->get<std::string>(), "'");
    auto sh = val.find("shape");
    ST_CHECK(sh != val.end() && sh->is_array(), "entry '", key, "' has no shape array");
    uint64_t numel = 1;
    bool overflow = false;
    for (auto& d : *sh) {
      ST_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), "entry '", key,
               "' has a shape that is not a list of non-negative integers: ", sh->dump());
      const uint64_t v = d.get<uint64_t>();
      ST_CHECK(v < (uint64_t(1) << 48), "entry '", key, "' has an absurd dimension ", v);
      if (v != 0 && numel > (uint64_t(1) << 62) / v) overflow = true;
      numel *= v;
      e.shape.push_back(int64_t(v));
    }
    ST_CHECK(!overflow, "entry '", key, "' has a shape whose element count overflows: ", sh->dump());
    auto off = val.find("data_offsets");
    ST_CHECK(off != val.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                 (*off)[1].is_number_unsigned(),
             "entry '", key, "' needs data_offsets [begin, end] of non-negative integers");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    ST_CHECK(e.begin <= e.end, "entry '", key, "' has data_offsets [", e.begin, ", ", e.end, "] with begin after end");
    ST_CHECK(e.end <= data_size, "entry '", key, "' has data_offsets [", e.begin, ", ", e.end,
             "] out of range: the data section has ", data_size, " bytes");
    const uint64_t want = numel * uint64_t(dtype_size(e.dtype));
    ST_CHECK(e.end - e.begin == want, "entry '", key, "' holds ", e.end - e.begin, " bytes but dtype ",
             dtype_safetensors_name(e.dtype), " x shape ", e.shape, " needs ", want);
    for (auto& [k2, v2] : val.items())
      ST_CHECK(k2 == "dtype" || k2 == "shape" || k2 == "data_offsets", "entry '", key, "' has unknown field '", k2, "'");
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    ST_CHECK(e.begin >= at, "entries '", entries[i - 1].name, "' and '", e.name, "' overlap (bytes ", e.begin, " < ", at, ")");
    ST_CHECK(e.begin == at, "gap before entry '", e.name, "': data_offsets begin at ", e.begin, ", previous data ends at ", at);
    at = e.end;
  }
  ST_CHECK(at == data_size, "the data section has ", data_size, " bytes but the entries cover ", at);

  for (const Entry& e : entries) {
    const char* p = base + e.begin;
    const int64_t es = dtype_size(e.dtype);
    Tensor t;
    if (keepalive && reinterpret_cast<uintptr_t>(p) % uintptr_t(es) == 0) {
      // Zero-copy view of the mapping (copy-on-write: in-place updates never reach the file).
      auto s = std::make_shared<Storage>();
      s->data = const_cast<char*>(p);
      s->nbytes = int64_t(e.end - e.begin);
      s->deleter = [keepalive](void*) {};
      Shape st(e.shape.size());
      int64_t stride = 1;
      for (size_t i = e.shape.size(); i-- > 0;) { st[i] = stride; stride *= std::max<int64_t>(e.shape[i], 1); }
      t = Tensor::from_storage(std::move(s), e.shape, st, 0, e.dtype);
    } else {
      t = Tensor::empty(e.shape, e.dtype);
      if (e.end > e.begin) std::memcpy(t.data_ptr(), p, e.end - e.begin);
    }
    if (e.dtype == DType::boolean) {
      const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        ST_CHECK(b[i] <= 1, "entry '", e.name, "' is BOOL but byte ", i, " holds ", int(b[i]));
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace

SafeTensors parse_safetensors(const void* data, size_t size, const std::string& name) {
  return parse(static_cast<const char*>(data), size, name, nullptr);
}

SafeTensors load_safetensors(const std::string& name) {
  const int fd = ::open(name.c_str(), O_RDONLY);
  ST_CHECK(fd >= 0, "cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SINTER_THROW(IOError, "[", name, "] is not a regular file");
  }
  auto map = std::make_shared<Mapping>();
  map->size = size_t(st.st_size);
  if (map->size > 0) map->base = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  ST_CHECK(map->size == 0 || map->base != MAP_FAILED, "mmap failed: ", std::strerror(err));
  const char* data = map->size ? static_cast<const char*>(map->base) : "";
  return parse(data, map->size, name, map);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata, int64_t align) {
  SINTER_CHECK_T(IOError, align >= 8 && (align & (align - 1)) == 0, "[", path, "] alignment ", align, " is not a power of two >= 8");
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> contiguous;
  std::vector<uint64_t> pads;  // zero bytes after each tensor, so the next starts aligned
  uint64_t at = 0;
  for (auto& [key, t] : tensors) {
    SINTER_CHECK_T(IOError, key != "__metadata__" && key.rfind("__pad", 0) != 0, "[", path, "] a tensor cannot be named ", key);
    SINTER_CHECK_T(IOError, t.defined() && !t.is_symbolic(), "[", path, "] tensor '", key, "' has no data");
    SINTER_CHECK_T(IOError, t.device().type == DeviceType::cpu, "[", path, "] tensor '", key, "' is on ", t.device(),
                   ": copy it to the CPU first (.to(Device::cpu()))");
    Tensor c = cpu::contiguous_as(t, t.dtype());  // (a CPU copy: the kernels build without the op table)
    const uint64_t n = uint64_t(c.numel() * c.element_size());
    header[key] = {{"dtype", dtype_safetensors_name(c.dtype())},
                   {"shape", std::vector<int64_t>(c.shape().begin(), c.shape().end())},
                   {"data_offsets", {at, at + n}}};
    at += n;
    contiguous.push_back(c);
    const uint64_t pad = (uint64_t(align) - at % uint64_t(align)) % uint64_t(align);
    if (align > 8 && pad > 0) {  // the format has no holes: padding is a tensor of its own
      header["__pad" + std::to_string(pads.size())] = {{"dtype", "U8"}, {"shape", {pad}}, {"data_offsets", {at, at + pad}}};
      at += pad;
    }
    pads.push_back(align > 8 ? pad : 0);
  }
  std::string h = header.dump();
  h.append((uint64_t(align) - (8 + h.size()) % uint64_t(align)) % uint64_t(align), ' ');  // the data starts aligned: loads are zero-copy
  const uint64_t hn = h.size();
  AtomicWriter w(path);
  w.write(&hn, 8);
  w.write(h);
  static const char zeros[64] = {};
  for (size_t i = 0; i < contiguous.size(); ++i) {
    w.write(contiguous[i].data_ptr(), size_t(contiguous[i].numel() * contiguous[i].element_size()));
    for (uint64_t left = pads[i]; left > 0; left -= std::min<uint64_t>(left, 64)) w.write(zeros, size_t(std::min<uint64_t>(left, 64)));
  }
  w.commit();
}

}  // namespace sinter::io
