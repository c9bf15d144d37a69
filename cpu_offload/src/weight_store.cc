#include "cpu_offload/weight_store.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstring>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"

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
                         const DtypeByName* convert, LayoutTag)
    : name_(std::move(name)) {
  size_t offset = 0;
  for (const auto& [tensor_name, tensor] : tensors) {
    OMNI_CHECK(tensor.defined(), "unit '", name_, "': tensor '", tensor_name, "' is undefined");
    UnitTensor entry;
    entry.name = tensor_name;
    entry.tensor = tensor;
    entry.dtype = tensor.scalar_type();
    if (convert) {
      const auto it = convert->find(tensor_name);
      if (it != convert->end()) entry.dtype = it->second;
    }
    entry.sizes = tensor.sizes().vec();
    entry.nbytes = static_cast<size_t>(tensor.numel()) * c10::elementSize(entry.dtype);
    entry.offset = align_up(offset, kTensorAlignment);
    offset = entry.offset + entry.nbytes;
    tensor_bytes_ += entry.nbytes;
    tensors_.push_back(std::move(entry));
  }
  bytes_ = align_up(offset, kTensorAlignment);
}

std::unique_ptr<OffloadUnit> OffloadUnit::layout_only(
    std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const DtypeByName* convert) {
  return std::unique_ptr<OffloadUnit>(
      new OffloadUnit(std::move(name), tensors, convert, LayoutTag{}));
}

OffloadUnit::OffloadUnit(std::string name,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         TransferEngine& engine, bool pin, const DtypeByName* convert)
    : OffloadUnit(std::move(name), tensors, convert, LayoutTag{}) {
  host_ = engine.allocate_host(bytes_, pin);
  for (auto& entry : tensors_) {
    const at::Tensor flat = flat_source(entry);
    write_elements(entry, flat, 0, flat.numel(), host_.data() + entry.offset);
    LoadProgress::add(flat.nbytes());
  }
  // Only now release the originals: a failure above leaves the module untouched.
  unbind();
}

at::Tensor OffloadUnit::flat_source(const UnitTensor& entry) {
  at::Tensor src = entry.tensor.detach();
  if (!src.device().is_cpu()) src = src.cpu();
  return src.contiguous().view({-1});
}

void OffloadUnit::write_elements(const UnitTensor& entry, const at::Tensor& flat_source,
                                 int64_t first, int64_t count, uint8_t* out) {
  if (count == 0) return;
  if (flat_source.scalar_type() == entry.dtype) {
    const size_t item = flat_source.element_size();
    std::memcpy(out, static_cast<const uint8_t*>(flat_source.data_ptr()) + first * item,
                static_cast<size_t>(count) * item);
    return;
  }
  // Converted straight into the destination: no converted copy of the tensor in between.
  at::from_blob(out, {count}, at::TensorOptions(entry.dtype))
      .copy_(flat_source.narrow(0, first, count));
}

void OffloadUnit::stream_to_device(TransferEngine& engine, const DeviceBuffer& dst,
                                   size_t dst_offset, size_t staging_bytes, bool pin) {
  OMNI_CHECK(!host_ && !bound_, "unit '", name_, "' is not a layout-only unit");
  OMNI_CHECK(dst_offset + bytes_ <= dst.bytes(), "unit '", name_, "' (", bytes_,
             " bytes) does not fit its device buffer at offset ", dst_offset, " (", dst.bytes(),
             " bytes)");
  c10::InferenceMode normal_tensors(false);
  // Two halves: one fills while the other's copy runs. Each holds at least one element of
  // the widest dtype.
  const size_t half =
      align_up(std::max<size_t>(std::min(staging_bytes / 2, bytes_), 64), kTensorAlignment);
  HostBuffer stage[2] = {engine.allocate_host(half, pin), engine.allocate_host(half, pin)};
  Event in_flight[2];
  std::vector<size_t> finished[2];  // tensors whose last bytes the half's copy carries
  std::vector<size_t> filling;
  std::vector<CopyOp> ops;
  int k = 0;
  size_t pos = 0;
  auto release = [&](std::vector<size_t>& indices) {
    for (size_t i : indices) {
      auto& entry = tensors_[i];
      entry.tensor.set_data(at::empty({0}, at::TensorOptions(entry.tensor.scalar_type())));
    }
    indices.clear();
  };
  auto flush = [&] {
    if (ops.empty()) return;
    in_flight[k] = engine.copy_async(ops, {});
    ops.clear();
    finished[k] = std::move(filling);
    filling.clear();
    k ^= 1;
    pos = 0;
    // The half about to be refilled: its copy must be over (the host writes into it), and
    // the tensors it finished are on the device.
    in_flight[k].host_wait();
    release(finished[k]);
  };
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const UnitTensor& entry = tensors_[i];
    const at::Tensor flat = flat_source(entry);
    const int64_t numel = flat.numel();
    const size_t item = c10::elementSize(entry.dtype);
    int64_t done = 0;
    while (done < numel) {
      if (pos + item > half) flush();
      const auto fit = static_cast<int64_t>((half - pos) / item);
      const int64_t count = std::min(numel - done, fit);
      write_elements(entry, flat, done, count, stage[k].data() + pos);
      LoadProgress::add(static_cast<uint64_t>(count) * flat.element_size());
      ops.push_back(CopyOp{stage[k], pos, dst, dst_offset + entry.offset + done * item,
                           static_cast<size_t>(count) * item});
      done += count;
      pos = align_up(pos + static_cast<size_t>(count) * item, kTensorAlignment);
    }
    filling.push_back(i);
  }
  flush();
  for (int j = 0; j < 2; ++j) {  // every copy over: the last tensors are on the device too
    in_flight[j].host_wait();
    release(finished[j]);
  }
  release(filling);                  // empty tensors after the last copy
  engine.release_finished_copies();  // the staging halves go with this function's return
  bind(dst, dst_offset);
}

CopyOp OffloadUnit::copy_to(const DeviceBuffer& dst, size_t dst_offset) const {
  OMNI_CHECK(host_, "unit '", name_, "' has no host copy to load from");
  return CopyOp{host_, 0, dst, dst_offset, bytes_};
}

void OffloadUnit::bind(const DeviceBuffer& buffer, size_t offset) {
  OMNI_CHECK(offset + bytes_ <= buffer.bytes(), "unit '", name_, "' (", bytes_,
             " bytes) does not fit its device buffer at offset ", offset, " (", buffer.bytes(),
             " bytes)");
  forget_bound_range();
  bound_observer_ = buffer.observer();
  bound_offset_ = offset;
  if (bound_observer_) bound_observer_->on_bind(offset, bytes_);
  c10::InferenceMode normal_tensors(false);
  for (auto& entry : tensors_) {
    entry.tensor.set_data(
        make_view(buffer.bytes_tensor(), offset + entry.offset, entry.sizes, entry.dtype));
  }
  bound_ = true;
}

void OffloadUnit::unbind() {
  forget_bound_range();
  c10::InferenceMode normal_tensors(false);
  for (auto& entry : tensors_) {
    entry.tensor.set_data(at::empty({0}, at::TensorOptions(entry.dtype)));
  }
  bound_ = false;
}

void OffloadUnit::forget_bound_range() {
  if (bound_observer_) bound_observer_->on_unbind(bound_offset_, bytes_);
  bound_observer_.reset();
}

}  // namespace omni::offload
