#include "util/read_text_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cpu_offload/check.h"

namespace omni::models {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    OMNI_THROW("cannot read ", what, " '", path, "': ", std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace omni::models
