// libFuzzer target: a checkpoint's .safetensors file (its header and the
// data the header points into). Opening gives the file or an error naming
// it; every tensor of a file that opens lies inside the file: its first and
// last bytes are read (past the mapping, that is a crash).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/baton-fuzz-" + std::to_string(::getpid()) + ".safetensors";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  auto file = baton::engine::SafetensorsFile::open(path);
  if (!file.is_ok()) return 0;
  volatile uint8_t sink = 0;
  for (const std::string& name : (*file)->names()) {
    const baton::engine::TensorInfo* t = (*file)->find(name);
    if (t == nullptr || t->nbytes == 0) continue;
    const auto* bytes = static_cast<const uint8_t*>(t->data);
    sink = sink ^ bytes[0] ^ bytes[t->nbytes - 1];
  }
  return 0;
}
