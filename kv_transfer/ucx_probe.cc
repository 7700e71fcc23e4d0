#include "kv_transfer/ucx_probe.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace baton::kv_transfer {
namespace {

template <typename PrintFn>
std::string capture(PrintFn print) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return {};
  print(stream);
  std::fclose(stream);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}

void add_unique(std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v) {
    if (x == s) return;
  }
  v.push_back(s);
}

}  // namespace

EndpointCaps parse_endpoint_info(const std::string& text) {
  EndpointCaps caps;
  caps.lane_table = text;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    // "lane[1]:  2:posix/memory.0 md[2] -> md[2]/posix/sysdev[255] rma_bw#0 ..."
    std::istringstream words(line.substr(lane));
    std::string word;
    words >> word;  // lane[N]:
    if (words >> word) {
      auto colon = word.find(':');
      std::string tl_dev = colon == std::string::npos ? word : word.substr(colon + 1);
      auto dot = tl_dev.rfind('.');
      if (dot != std::string::npos) tl_dev = tl_dev.substr(0, dot);
      add_unique(caps.transports, tl_dev);
    }
    while (words >> word) {
      if (word.rfind("rma", 0) == 0) caps.native_rma = true;
    }
  }
  return caps;
}

EndpointCaps probe_endpoint(ucp_ep_h ep) {
  return parse_endpoint_info(capture([&](FILE* f) { ucp_ep_print_info(ep, f); }));
}

std::vector<std::string> context_transports(ucp_context_h context) {
  std::string text = capture([&](FILE* f) { ucp_context_print_info(context, f); });
  std::vector<std::string> transports;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    // "#     resource 1  :  md 1  dev 1  flags -- tcp/lo"
    if (line.find("resource") == std::string::npos) continue;
    auto space = line.find_last_of(' ');
    if (space != std::string::npos && line.find('/', space) != std::string::npos) {
      add_unique(transports, line.substr(space + 1));
    }
  }
  return transports;
}

}  // namespace baton::kv_transfer
