// SafetensorsFile: mapping, header validation and zero-copy tensors.
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>

#include "cpu_offload/check.h"
#include "model_runner/weights/safetensors.h"
#include "safetensors_dtype.h"
#include "similar_names.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian and tensor() views them in place"
#endif

namespace omni::models {
namespace {

using nlohmann::json;

std::string in_file(const std::string& path) { return "safetensors file '" + path + "': "; }

// Closes the descriptor on every way out of map_readonly(); the mapping does not need it.
struct ScopedFd {
  int fd;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

std::shared_ptr<const uint8_t> map_readonly(const std::string& path, size_t* size) {
  ScopedFd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    const int err = errno;
    OMNI_THROW("cannot open safetensors file '", path, "': ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) {
    const int err = errno;
    OMNI_THROW(in_file(path), "fstat failed: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) OMNI_THROW(in_file(path), "not a regular file");
  *size = static_cast<size_t>(st.st_size);
  // Checked before mmap, which rejects a zero length.
  if (*size < 8) {
    OMNI_THROW(in_file(path), "file is ", *size,
               " bytes, shorter than the 8-byte header length field");
  }
  void* p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    OMNI_THROW(in_file(path), "mmap of ", *size, " bytes failed: ", std::strerror(err));
  }
  const size_t length = *size;
  return std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(p), [length](const uint8_t* q) {
    ::munmap(const_cast<uint8_t*>(q), length);
  });
}

// Takes the pages of [data, data + bytes) out of the resident set (see SafetensorsFile::tensor).
void drop_pages(void* data, size_t bytes) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Shape dimensions and offsets: JSON integers >= 0 that fit in int64 (ATen sizes are int64).
// The parser stores non-negative integers as number_unsigned, negative ones as
// number_integer, so a negative value or a float fails the first test.
bool as_index(const json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return *out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// One header entry, validated against the data section [data_start, data_start + data_size).
TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry,
                       size_t data_start, size_t data_size) {
  const std::string where = in_file(path) + "tensor '" + name + "': ";
  if (!entry.is_object()) {
    OMNI_THROW(where, "header entry must be an object, got ", entry.type_name());
  }
  TensorInfo info;
  info.name = name;

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    OMNI_THROW(where, "'dtype' must be a string");
  }
  const auto dtype = detail::safetensors_to_dtype(dtype_it->get<std::string>());
  if (!dtype) {
    OMNI_THROW(where, "unknown dtype '", dtype_it->get<std::string>(),
               "' (supported: ", detail::supported_safetensors_dtypes(), ")");
  }
  info.dtype = *dtype;

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    OMNI_THROW(where, "'shape' must be an array of non-negative integers");
  }
  uint64_t numel = 1;
  for (const json& d : *shape_it) {
    uint64_t dim = 0;
    if (!as_index(d, &dim)) {
      OMNI_THROW(where, "'shape' must be an array of non-negative integers, got ",
                 shape_it->dump());
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      OMNI_THROW(where, "shape ", shape_it->dump(), " overflows the element count");
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, c10::elementSize(info.dtype), &nbytes)) {
    OMNI_THROW(where, "shape ", shape_it->dump(), " overflows the byte count");
  }

  const auto offsets_it = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !as_index((*offsets_it)[0], &begin) || !as_index((*offsets_it)[1], &end)) {
    OMNI_THROW(where, "'data_offsets' must be [begin, end] with non-negative integers");
  }
  if (begin > end) OMNI_THROW(where, "data_offsets [", begin, ", ", end, "] has begin > end");
  if (end > data_size) {
    OMNI_THROW(where, "data_offsets [", begin, ", ", end,
               "] run past the end of the data section (", data_size,
               " bytes; the file is truncated or the header is wrong)");
  }
  if (end - begin != nbytes) {
    OMNI_THROW(where, "data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes but ",
               dtype_it->get<std::string>(), " ", shape_str(info.shape), " needs ", nbytes);
  }
  info.offset = data_start + static_cast<size_t>(begin);
  info.nbytes = static_cast<size_t>(nbytes);
  return info;
}

// Two tensors sharing bytes would alias each other once loaded; the format forbids it.
void check_no_overlap(const std::string& path, const std::map<std::string, TensorInfo>& tensors,
                      size_t data_start) {
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, info] : tensors) {
    if (info.nbytes > 0) by_offset.push_back(&info);  // empty tensors occupy no bytes
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->offset, a->name) < std::tie(b->offset, b->name);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.offset < prev.offset + prev.nbytes) {
      OMNI_THROW(in_file(path), "tensors '", prev.name, "' and '", cur.name,
                 "' overlap (data_offsets [", prev.offset - data_start, ", ",
                 prev.offset + prev.nbytes - data_start, "] and [", cur.offset - data_start, ", ",
                 cur.offset + cur.nbytes - data_start, "])");
    }
  }
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& meta) {
  if (!meta.is_object()) {
    OMNI_THROW(in_file(path), "'__metadata__' must be an object of strings, got ",
               meta.type_name());
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      OMNI_THROW(in_file(path), "'__metadata__' value '", key, "' must be a string, got ",
                 value.type_name());
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = map_readonly(path, &file.file_size_);
  const uint8_t* base = file.mapping_.get();

  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (header_size > file.file_size_ - 8) {
    OMNI_THROW(in_file(path), "header length ", header_size, " exceeds the ", file.file_size_ - 8,
               " bytes after the length field (truncated, or not a safetensors file)");
  }
  json header;
  try {
    header = json::parse(base + 8, base + 8 + header_size);
  } catch (const json::parse_error& e) {
    OMNI_THROW(in_file(path), "header is not valid JSON (byte ", e.byte, " of the ", header_size,
               "-byte header): ", e.what());
  }
  if (!header.is_object()) {
    OMNI_THROW(in_file(path), "header must be a JSON object, got ", header.type_name());
  }

  const size_t data_start = 8 + static_cast<size_t>(header_size);
  const size_t data_size = file.file_size_ - data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      file.metadata_ = parse_metadata(path, entry);
    } else {
      file.tensors_.emplace(name, parse_entry(path, name, entry, data_start, data_size));
    }
  }
  check_no_overlap(path, file.tensors_, data_start);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    OMNI_THROW(in_file(path_), "no tensor '", name, "' among its ", tensors_.size(), " tensors",
               detail::similar_names_suffix(name, names()));
  }
  return it->second;
}

const uint8_t* SafetensorsFile::data(const std::string& name) const {
  return mapping_.get() + info(name).offset;
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  void* bytes = const_cast<uint8_t*>(mapping_.get() + ti.offset);
  const auto options = at::TensorOptions().dtype(ti.dtype).device(at::kCPU);
  if (reinterpret_cast<uintptr_t>(bytes) % c10::elementSize(ti.dtype) != 0) {
    at::Tensor copy = at::empty(ti.shape, options);
    if (ti.nbytes > 0) std::memcpy(copy.data_ptr(), bytes, ti.nbytes);
    return copy;
  }
  // The deleter holds the mapping: it stays mapped while any view of it is alive. When this
  // view dies (e.g. the offload engine has packed the weight into its own slab and let the
  // parameter go), its pages leave the process's resident set: the mapping is a private,
  // read-only view of the file, so dropping them loses nothing (a later read of the same bytes
  // faults them in again from the page cache). Without this, loading holds every weight twice,
  // once in the file's pages and once in the engine's slabs. The range is widened to whole pages,
  // which may drop a neighbour's edge page: that neighbour only refaults it.
  return at::from_blob(
      bytes, ti.shape,
      [keep = mapping_, nbytes = ti.nbytes](void* data) { drop_pages(data, nbytes); }, options);
}

}  // namespace omni::models
