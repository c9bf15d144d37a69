// What a user reads of an error: its message without the " [file.cc:12]" that OMNI_CHECK and
// OMNI_THROW (check.h) append (where in the source it was thrown is for developers).
#pragma once

#include <exception>
#include <string>

namespace omni {

std::string reason_of(const std::exception& e);

}  // namespace omni
