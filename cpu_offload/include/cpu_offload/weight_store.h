// Offload units and their host slabs.
//
// An offload unit (a block, a phase of a block, a component, or the resident set) keeps all
// its tensors, of every dtype, in one contiguous aligned host slab, so the unit moves to the
// device in a single copy. Packing a unit releases each tensor's original storage: the
// weights are never held twice in host memory. On the device, the unit's tensors are views
// into an engine-owned buffer (a slot); the module's parameters are rebound to those views
// in place, so model code sees ordinary parameters. Nothing is ever copied back.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu_offload/transfer_engine.h"

namespace omni::offload {

struct UnitTensor {
  std::string name;  // dotted path from the root module
  // Shares its TensorImpl with the module's parameter or buffer: rebinding this tensor
  // rebinds the module's.
  at::Tensor tensor;
  size_t offset = 0;  // byte offset in the slab
  size_t nbytes = 0;
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;  // in the slab: after conversion, when converted
};

// Tensors to convert while packing, by dotted name: the dtype the model wants for each. A
// loader that reads weights in the checkpoint's dtype and leaves the conversion to the engine
// (OffloadConfig::convert_dtypes) never holds a converted copy of the whole model: each unit
// is converted straight into its own slab, or into the staging buffer on its way to the device.
using DtypeByName = std::unordered_map<std::string, at::ScalarType>;

class OffloadUnit {
 public:
  // Packs `tensors` into one slab from `engine` (pinned if `pin`), converting those named in
  // `convert`, and releases their storage.
  OffloadUnit(std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              TransferEngine& engine, bool pin, const DtypeByName* convert = nullptr);
  // Lays the tensors out as a slab would hold them, but packs nothing and leaves them as they
  // are: for a unit that goes straight to the device (stream_to_device) and has no host slab.
  static std::unique_ptr<OffloadUnit> layout_only(
      std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
      const DtypeByName* convert = nullptr);

  const std::string& name() const { return name_; }
  const std::vector<UnitTensor>& tensors() const { return tensors_; }
  // Slab size: the tensors' bytes plus alignment padding.
  size_t bytes() const { return bytes_; }
  // Sum of the tensors' own bytes.
  size_t tensor_bytes() const { return tensor_bytes_; }
  const HostBuffer& host() const { return host_; }

  // The copy that brings this unit to `dst` at `dst_offset`.
  CopyOp copy_to(const DeviceBuffer& dst, size_t dst_offset) const;
  // Rebinds every tensor as a view into `buffer` at `offset` (the unit must be there, and
  // compute must have waited for its copy). The buffer's observer is told: from now on
  // compute reads that range.
  void bind(const DeviceBuffer& buffer, size_t offset);
  // Rebinds every tensor to an empty placeholder: a forward that runs without the unit
  // loaded fails loudly instead of computing with stale or missing weights.
  void unbind();
  bool bound() const { return bound_; }
  // Drops the host slab (for units that stay on the device for good).
  void release_host() { host_ = HostBuffer(); }

  // Copies a layout-only unit to `dst` at `dst_offset` through a pinned staging buffer of
  // `staging_bytes` (two halves, filled in turn while the other one's copy runs), converting
  // as it goes, then binds it there. Each tensor's original storage is let go as soon as its
  // bytes are on the device, so host memory grows by the staging buffer, not by the unit:
  // resident weights never need a host slab the size of the resident set. A failure part-way
  // leaves the tensors already copied unbound (the model has lost them; the load fails).
  void stream_to_device(TransferEngine& engine, const DeviceBuffer& dst, size_t dst_offset,
                        size_t staging_bytes, bool pin);

 private:
  struct LayoutTag {};
  OffloadUnit(std::string name, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              const DtypeByName* convert, LayoutTag);
  // The tensor's bytes as a flat, contiguous CPU tensor in its own dtype.
  static at::Tensor flat_source(const UnitTensor& entry);
  // Writes elements [first, first + count) of tensor `entry`'s source, in the unit's dtype for
  // it, to `out`.
  static void write_elements(const UnitTensor& entry, const at::Tensor& flat_source, int64_t first,
                             int64_t count, uint8_t* out);

  // Tells the observer of the buffer bound to (if any) that its range is no longer read.
  void forget_bound_range();

  std::string name_;
  std::vector<UnitTensor> tensors_;
  size_t bytes_ = 0;
  size_t tensor_bytes_ = 0;
  HostBuffer host_;
  bool bound_ = false;
  // Of the buffer bound to (when it has one): told when the views go.
  std::shared_ptr<DeviceBuffer::Observer> bound_observer_;
  size_t bound_offset_ = 0;
};

// A view of `sizes`/`dtype` at byte `offset` of `storage_owner`'s storage.
at::Tensor make_view(const at::Tensor& storage_owner, size_t offset, at::IntArrayRef sizes,
                     at::ScalarType dtype);

}  // namespace omni::offload
