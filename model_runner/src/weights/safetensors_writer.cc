// write_safetensors: the inverse of SafetensorsFile, for tests and conversion tools.
#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "cpu_offload/check.h"
#include "model_runner/weights/safetensors.h"
#include "safetensors_dtype.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little-endian and are written from memory as they are"
#endif

namespace omni::models {
namespace {

// Owns the temporary file until commit(): any exception on the way removes it.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) {
      const int err = errno;
      OMNI_THROW("write_safetensors: cannot create '", path_, "': ", std::strerror(err));
    }
  }
  ~TempFile() {
    if (file_) std::fclose(file_);
    if (!committed_) std::remove(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, size_t n) {
    if (n > 0 && std::fwrite(data, 1, n, file_) != n) {
      const int err = errno;
      OMNI_THROW("write_safetensors: writing '", path_, "' failed: ", std::strerror(err));
    }
  }
  void commit(const std::string& final_path) {
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) {
      const int err = errno;
      OMNI_THROW("write_safetensors: closing '", path_, "' failed: ", std::strerror(err));
    }
    if (std::rename(path_.c_str(), final_path.c_str()) != 0) {
      const int err = errno;
      OMNI_THROW("write_safetensors: renaming '", path_, "' to '", final_path,
                 "' failed: ", std::strerror(err));
    }
    committed_ = true;
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      OMNI_THROW("write_safetensors('", path, "'): tensor '", name, "' is undefined");
    }
    if (t.layout() != at::kStrided) {
      OMNI_THROW("write_safetensors('", path, "'): tensor '", name, "' is not dense");
    }
    specs.push_back({name, t.sizes().vec(), t.scalar_type()});
  }
  write_safetensors(
      path, specs, [&](size_t i) { return tensors[i].second; }, metadata);
}

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::function<at::Tensor(size_t)>& make,
                       const std::map<std::string, std::string>& metadata) {
  const std::string where = "write_safetensors('" + path + "'): ";
  struct Entry {
    size_t index;
    const char* dtype;
    size_t element_size;
    size_t nbytes;
  };
  std::vector<Entry> entries;
  std::set<std::string> seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    const auto& name = spec.name;
    if (name.empty() || name == "__metadata__")
      OMNI_THROW(where, "invalid tensor name '", name, "'");
    if (!seen.insert(name).second) OMNI_THROW(where, "duplicate tensor name '", name, "'");
    const char* dtype = detail::dtype_to_safetensors(spec.dtype);
    if (!dtype) {
      OMNI_THROW(where, "tensor '", name, "' has dtype ", spec.dtype,
                 ", which safetensors cannot store (supported: ",
                 detail::supported_safetensors_dtypes(), ")");
    }
    size_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<size_t>(d);
    const size_t element = c10::elementSize(spec.dtype);
    entries.push_back({i, dtype, element, numel * element});
  }
  // Larger elements first: with the data section 8-byte aligned, every tensor then starts at
  // a multiple of its element size, which SafetensorsFile::tensor() needs to avoid a copy.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.element_size > b.element_size; });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const Entry& e : entries) {
    header[specs[e.index].name] = {{"dtype", e.dtype},
                                   {"shape", specs[e.index].shape},
                                   {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    OMNI_THROW(where, "cannot encode the header (names and metadata must be UTF-8): ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  TempFile out(path + ".tmp");
  out.write(length, sizeof(length));
  out.write(text.data(), text.size());
  for (const Entry& e : entries) {
    const auto& spec = specs[e.index];
    const at::Tensor t = make(e.index).to(at::kCPU).contiguous();
    if (t.sizes().vec() != spec.shape || t.scalar_type() != spec.dtype) {
      OMNI_THROW(where, "tensor '", spec.name, "' was declared ", spec.dtype, " ",
                 at::IntArrayRef(spec.shape), " but made as ", t.scalar_type(), " ", t.sizes());
    }
    out.write(t.data_ptr(), t.nbytes());
  }
  out.commit(path);
}

}  // namespace omni::models
