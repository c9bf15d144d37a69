// Hugging Face safetensors checkpoints, read through a read-only mmap so that loading a
// multi-GB model costs no copy: tensors are views of the page cache until they are moved to
// the device (or into the offload engine's slabs).
//
// Format: an 8-byte little-endian u64 N, N bytes of JSON header
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}),
// then the data section; offsets are relative to its start. Every header field is validated
// before anything points into the data, and every error names the file (and the tensor).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace omni::models {

struct TensorInfo {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  size_t offset;  // absolute byte offset in the file (not relative to the data section)
  size_t nbytes;
};

// One .safetensors file. Copies are cheap and share the mapping, which lives until the last
// copy and the last tensor returned by tensor() are gone.
class SafetensorsFile {
 public:
  // Maps and validates `path`; throws omni::Error naming the file and what is wrong.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in sorted order.
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws naming the file, the tensor and up to 5 similar names when `name` is absent.
  const TensorInfo& info(const std::string& name) const;
  // The tensor's bytes inside the mapping (read-only).
  const uint8_t* data(const std::string& name) const;
  // A CPU tensor viewing the mapping without a copy. The pages are mapped read-only: the
  // tensor must not be written to (a write faults); clone() it or copy it to a device first.
  // Exception: bytes not aligned to the element size (possible in files from other writers)
  // are copied into an aligned tensor, since ATen kernels assume aligned elements.
  at::Tensor tensor(const std::string& name) const;
  // The optional "__metadata__" object (e.g. {"format": "pt"}).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const uint8_t> mapping_;  // munmap()s when the last holder goes
  size_t file_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights: one file, or shards listed by model.safetensors.index.json.
class SafetensorsCheckpoint {
 public:
  // `path` is a directory holding model.safetensors.index.json (preferred) or
  // model.safetensors (or, a diffusers component folder, the same named
  // diffusion_pytorch_model), a *.index.json file, or a single .safetensors file. Every shard
  // is opened once, and every tensor the index lists must be in the shard it names.
  static SafetensorsCheckpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  size_t size() const { return owner_.size(); }
  bool has(const std::string& name) const { return owner_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const uint8_t* data(const std::string& name) const;
  at::Tensor tensor(const std::string& name) const;  // same contract as SafetensorsFile
  // Path of the file that holds `name`.
  const std::string& file_of(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  const SafetensorsFile& file_for(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

// Writes `tensors` (any device, any layout that can be made contiguous) as a safetensors
// file. The header is padded with spaces to a multiple of 8 bytes and the data are laid out by
// decreasing element size, so every tensor is aligned and reads back zero-copy. Writes
// `path + ".tmp"` and renames it: a failure never leaves a half-written `path`.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same file, with each tensor made by `make(i)` only when it is written: one tensor in
// memory at a time (for checkpoints larger than RAM). `make(i)` must return a tensor of
// specs[i]'s shape and dtype.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       const std::function<at::Tensor(size_t)>& make,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace omni::models
