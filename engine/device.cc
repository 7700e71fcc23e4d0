#include "engine/device.h"

#include <charconv>

namespace baton::engine {

std::string Device::name() const {
  return kind == Kind::kCpu ? "cpu" : "cuda:" + std::to_string(index);
}

Result<Device> parse_device(std::string_view text, std::string_view key) {
  auto fail = [&] {
    return invalid_argument(std::string(key) + ": expected cpu, cuda or cuda:N, got '" +
                            std::string(text) + "'");
  };
  if (text == "cpu") return Device{};
  if (text == "cuda") return Device{.kind = Device::Kind::kCuda, .index = 0};
  constexpr std::string_view kPrefix = "cuda:";
  if (!text.starts_with(kPrefix)) return fail();
  std::string_view digits = text.substr(kPrefix.size());
  int32_t index = -1;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0 ||
      index > 1023) {
    return fail();
  }
  return Device{.kind = Device::Kind::kCuda, .index = index};
}

}  // namespace baton::engine
