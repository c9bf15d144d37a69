// A model family's own parts of a core type (a request's parameters, a result's outputs), kept
// by their type: the core carries them and names none, the family reads back its own struct.
// Copies copy the parts (a request copied to add defaults does not change the caller's).
#pragma once

#include <any>
#include <map>
#include <typeindex>
#include <typeinfo>

namespace omni::pipeline {

class FamilyParts {
 public:
  // The part of type T, added with T's defaults when absent.
  template <typename T>
  T& get() {
    std::any& part = parts_[std::type_index(typeid(T))];
    if (!part.has_value()) part = T{};
    return *std::any_cast<T>(&part);
  }
  // The part of type T, or null when none was set.
  template <typename T>
  const T* find() const {
    const auto it = parts_.find(std::type_index(typeid(T)));
    return it == parts_.end() ? nullptr : std::any_cast<T>(&it->second);
  }
  // The part of type T, or T's defaults.
  template <typename T>
  T value() const {
    const T* part = find<T>();
    return part ? *part : T{};
  }

 private:
  std::map<std::type_index, std::any> parts_;
};

}  // namespace omni::pipeline
