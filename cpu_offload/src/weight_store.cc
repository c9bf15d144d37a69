#include "cpu_offload/weight_store.h"

#include <ATen/ops/empty.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>

#include <cstring>

#include "cpu_offload/check.h"

namespace omni::offload {

at::Tensor make_view(const at::Tensor& storage_owner, size_t offset, at::IntArrayRef sizes,
                     at::ScalarType dtype) {
  const size_t item = c10::elementSize(dtype);
  OMNI_CHECK(offset % item == 0, "offset ", offset, " not aligned to ", item, " bytes");
  auto view = at::empty({0}, at::TensorOptions(dtype).device(storage_owner.device()));
  view.set_(storage_owner.storage(),
            static_cast<int64_t>(
                (storage_owner.storage_offset() * storage_owner.element_size() + offset) / item),
            sizes, c10::contiguous_strides(sizes));
  return view;
}

OffloadUnit::OffloadUnit(std::string name,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         TransferEngine& engine, bool pin)
    : name_(std::move(name)) {
  // Normal (non-inference) tensors: parameters created outside InferenceMode may only be
  // rebound to data of the same kind.
  c10::InferenceMode normal_tensors(false);
  size_t offset = 0;
  for (const auto& [tensor_name, tensor] : tensors) {
    OMNI_CHECK(tensor.defined(), "unit '", name_, "': tensor '", tensor_name, "' is undefined");
    UnitTensor entry;
    entry.name = tensor_name;
    entry.tensor = tensor;
    entry.dtype = tensor.scalar_type();
    entry.sizes = tensor.sizes().vec();
    entry.nbytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
    entry.offset = align_up(offset, kTensorAlignment);
    offset = entry.offset + entry.nbytes;
    tensor_bytes_ += entry.nbytes;
    tensors_.push_back(std::move(entry));
  }
  bytes_ = align_up(offset, kTensorAlignment);
  host_ = engine.allocate_host(bytes_, pin);
  for (auto& entry : tensors_) {
    at::Tensor src = entry.tensor.detach();
    if (!src.device().is_cpu()) src = src.cpu();
    src = src.contiguous();
    if (entry.nbytes > 0) std::memcpy(host_.data() + entry.offset, src.data_ptr(), entry.nbytes);
  }
  // Only now release the originals: a failure above leaves the module untouched.
  unbind();
}

CopyOp OffloadUnit::copy_to(const DeviceBuffer& dst, size_t dst_offset) const {
  OMNI_CHECK(host_, "unit '", name_, "' has no host copy to load from");
  return CopyOp{host_, 0, dst, dst_offset, bytes_};
}

void OffloadUnit::bind(const DeviceBuffer& buffer, size_t offset) {
  OMNI_CHECK(offset + bytes_ <= buffer.bytes(), "unit '", name_, "' (", bytes_,
             " bytes) does not fit its device buffer at offset ", offset, " (", buffer.bytes(),
             " bytes)");
  c10::InferenceMode normal_tensors(false);
  for (auto& entry : tensors_) {
    entry.tensor.set_data(
        make_view(buffer.bytes_tensor(), offset + entry.offset, entry.sizes, entry.dtype));
  }
  bound_ = true;
}

void OffloadUnit::unbind() {
  c10::InferenceMode normal_tensors(false);
  for (auto& entry : tensors_) {
    entry.tensor.set_data(at::empty({0}, at::TensorOptions(entry.dtype)));
  }
  bound_ = false;
}

}  // namespace omni::offload
