// The playground page (worker/http/playground.html), compiled into the binary: CMake embeds the
// file's text into playground.cc at configure time, so the server needs no files at run time.
#pragma once

namespace omni::http {

const char* playground_html();

}  // namespace omni::http
