#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace baton::engine {

using nlohmann::json;

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const std::string name = path.string();
  // O_NONBLOCK: a FIFO in a checkpoint would block the open for a writer;
  // it is refused below as any file that is not regular.
  file->fd_.reset(::open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!file->fd_.valid()) {
    int err = errno;
    std::string m = "cannot open " + name + ": " + std::strerror(err);
    return err == ENOENT ? not_found(m) : io_error(m);
  }
  struct stat st;
  if (::fstat(file->fd_.get(), &st) != 0) return io_error("cannot stat " + name);
  if (!S_ISREG(st.st_mode)) return io_error(name + " is not a regular file");
  file->size_ = uint64_t(st.st_size);
  if (file->size_ < 8) {
    return data_loss(name + ": file is " + std::to_string(file->size_) +
                     " bytes, shorter than the 8-byte header length");
  }
  // MAP_PRIVATE read-only: pages come from the page cache, shared with other
  // processes mapping the same checkpoint.
  BATON_ASSIGN_OR_RETURN(file->map_, map_file_read_only(file->fd_.get(), file->size_, name));
  BATON_RETURN_IF_ERROR(file->parse());
  return file;
}

HugePageReport SafetensorsFile::map_in_huge_pages() {
  return engine::map_in_huge_pages(map_, size_, fd_.get());
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

Status SafetensorsFile::parse() {
  const std::string file = path_.string();
  const auto* base = static_cast<const unsigned char*>(map_);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | base[i];
  if (header_len > kMaxHeaderBytes) {
    return data_loss(file + ": header length " + std::to_string(header_len) +
                     " is larger than the limit of " + std::to_string(kMaxHeaderBytes));
  }
  if (header_len > size_ - 8) {
    return data_loss(file + ": header length " + std::to_string(header_len) +
                     " runs past the end of the " + std::to_string(size_) + "-byte file");
  }
  const char* header = reinterpret_cast<const char*>(base + 8);
  json doc = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return data_loss(file + ": header is not valid JSON");
  if (!doc.is_object()) return data_loss(file + ": header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size_ - data_start;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  spans.reserve(doc.size());

  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& tname = it.key();
    const json& entry = it.value();
    if (tname == "__metadata__") {
      if (!entry.is_object()) return data_loss(file + ": __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return data_loss(file + ": __metadata__ value of '" + m.key() + "' is not a string");
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = file + ": tensor '" + tname + "'";
    if (!entry.is_object()) return data_loss(where + " is not an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end()) return data_loss(where + " has no dtype");
    if (shape_it == entry.end()) return data_loss(where + " has no shape");
    if (offsets_it == entry.end()) return data_loss(where + " has no data_offsets");
    if (!dtype_it->is_string()) return data_loss(where + ": dtype is not a string");
    if (!shape_it->is_array()) return data_loss(where + ": shape is not a list");
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      return data_loss(where + ": data_offsets is not a list of two integers");
    }

    TensorInfo info;
    info.name = tname;
    const std::string dtype_name = dtype_it->get<std::string>();
    auto dtype = parse_safetensors_dtype(dtype_name);
    if (!dtype) {
      return unimplemented(where + ": dtype " + dtype_name +
                           " is not supported (F32, F16, BF16 are)");
    }
    info.dtype = *dtype;

    uint64_t numel = 1;
    bool overflow = false;
    for (const json& d : *shape_it) {
      if (!d.is_number_integer()) return data_loss(where + ": shape has a non-integer dimension");
      if (!d.is_number_unsigned() && d.get<int64_t>() < 0) {
        return data_loss(where + ": shape has a negative dimension " + d.dump());
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(INT64_MAX)) overflow = true;
      if (__builtin_mul_overflow(numel, dim, &numel)) overflow = true;
      info.shape.push_back(int64_t(std::min<uint64_t>(dim, uint64_t(INT64_MAX))));
    }
    uint64_t nbytes = 0;
    if (overflow || numel > uint64_t(INT64_MAX) ||
        __builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &nbytes)) {
      return data_loss(where + ": shape " + shape_to_string(info.shape) + " overflows");
    }

    const json& b = (*offsets_it)[0];
    const json& e = (*offsets_it)[1];
    if (!b.is_number_unsigned() || !e.is_number_unsigned()) {
      // nlohmann stores non-negative literals as unsigned, so this catches
      // negatives, floats and non-numbers alike.
      return data_loss(where + ": data_offsets are not non-negative integers");
    }
    const uint64_t begin = b.get<uint64_t>();
    const uint64_t end = e.get<uint64_t>();
    if (begin > end) {
      return data_loss(where + ": data_offsets begin " + std::to_string(begin) + " > end " +
                       std::to_string(end));
    }
    if (end > data_size) {
      return data_loss(where + ": data_offsets end " + std::to_string(end) +
                       " is past the end of the data section (" + std::to_string(data_size) +
                       " bytes)");
    }
    if (end - begin != nbytes) {
      return data_loss(where + ": " + std::to_string(end - begin) + " bytes of data but shape " +
                       shape_to_string(info.shape) + " x " + dtype_name + " needs " +
                       std::to_string(nbytes));
    }
    // The mapping is page aligned, so the file offset decides alignment.
    if ((data_start + begin) % dtype_size(info.dtype) != 0) {
      return data_loss(where + ": data at file offset " + std::to_string(data_start + begin) +
                       " is not aligned to its " + std::to_string(dtype_size(info.dtype)) +
                       "-byte elements");
    }
    info.nbytes = size_t(nbytes);
    info.data = base + data_start + begin;
    auto [pos, inserted] = tensors_.emplace(tname, std::move(info));
    if (nbytes > 0) spans.push_back({begin, end, &pos->first});
  }

  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return data_loss(file + ": tensors '" + *spans[i - 1].name + "' and '" + *spans[i].name +
                       "' overlap");
    }
  }
  return Status::ok();
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

}  // namespace baton::engine
