#include "engine/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace baton::engine {

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(
    const std::filesystem::path& path, std::vector<TensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name == "__metadata__" || !seen.insert(t.name).second) {
      return invalid_argument(file + ": duplicate or reserved tensor name '" + t.name + "'");
    }
    for (int64_t d : t.shape) {
      if (d < 0) return invalid_argument(file + ": tensor '" + t.name + "' has a negative dim");
    }
    // Padding between tensors would leave holes, which the reference reader
    // rejects; so each tensor must already start aligned to its element size.
    if (offset % dtype_size(t.dtype) != 0) {
      return invalid_argument(file + ": tensor '" + t.name + "' would start at data offset " +
                              std::to_string(offset) + ", not aligned to its " +
                              std::to_string(dtype_size(t.dtype)) +
                              "-byte elements; declare wider dtypes first");
    }
    const uint64_t n = t.nbytes();
    header[t.name] = {{"dtype", std::string(dtype_safetensors_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts
  // 8-aligned and every tensor stays aligned to its element size.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->total_ = offset;
  w->fd_.reset(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!w->fd_.valid()) return io_error("cannot create " + file + ": " + std::strerror(errno));
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = (unsigned char)(n >> (8 * i));
  BATON_RETURN_IF_ERROR(w->write_all(len, sizeof len));
  BATON_RETURN_IF_ERROR(w->write_all(text.data(), text.size()));
  return w;
}

Status SafetensorsWriter::write_all(const void* data, size_t nbytes) {
  if (!fd_.valid()) return internal_error(path_.string() + ": write after finish");
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_.get(), p, nbytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write " + path_.string() + ": " + std::strerror(errno));
    }
    p += n;
    nbytes -= size_t(n);
  }
  return Status::ok();
}

Status SafetensorsWriter::write(const void* data, size_t nbytes) {
  if (nbytes > total_ - written_) {
    return out_of_range(path_.string() + ": " + std::to_string(nbytes) +
                        " bytes written with only " + std::to_string(total_ - written_) +
                        " declared bytes left");
  }
  BATON_RETURN_IF_ERROR(write_all(data, nbytes));
  written_ += nbytes;
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (!fd_.valid()) return internal_error(path_.string() + ": finished twice");
  if (written_ != total_) {
    return out_of_range(path_.string() + ": finished after " + std::to_string(written_) + " of " +
                        std::to_string(total_) + " declared data bytes");
  }
  // close() can report a deferred write error (e.g. on network filesystems).
  if (::close(fd_.release()) != 0)
    return io_error("cannot close " + path_.string() + ": " + std::strerror(errno));
  return Status::ok();
}

}  // namespace baton::engine
