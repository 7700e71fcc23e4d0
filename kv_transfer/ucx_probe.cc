#include "kv_transfer/ucx_probe.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include <uct/api/uct.h>

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

EndpointCaps parse_endpoint_info(const std::string& text,
                                 const std::vector<std::string>& registering_domains) {
  EndpointCaps caps;
  caps.lane_table = text;
  std::map<int, std::string> lane_domain;  // lane index -> remote memory domain
  std::vector<int> rma_lanes;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (auto lane = line.find("lane["); lane != std::string::npos) {
      // "lane[1]:  2:posix/memory.0 md[2] -> md[2]/posix/sysdev[255] rma_bw#0 ..."
      int index = std::atoi(line.c_str() + lane + 5);
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
      auto arrow = line.find("-> md[");
      if (arrow != std::string::npos) {
        auto slash = line.find('/', arrow);
        auto end = line.find('/', slash + 1);
        if (slash != std::string::npos && end != std::string::npos) {
          lane_domain[index] = line.substr(slash + 1, end - slash - 1);
        }
      }
      while (words >> word) {
        if (word.rfind("rma#", 0) == 0) rma_lanes.push_back(index);
      }
    } else if (auto put = line.find("put["); put != std::string::npos) {
      // "put[1]: 0..<short>..4294967296..<bcopy>..(inf)": lane 1 serves puts.
      rma_lanes.push_back(std::atoi(line.c_str() + put + 4));
    }
  }
  for (int lane : rma_lanes) {
    auto it = lane_domain.find(lane);
    if (it == lane_domain.end()) continue;
    add_unique(caps.rma_domains, it->second);
    for (const auto& d : registering_domains) {
      if (d == it->second) caps.native_rma = true;
    }
  }
  return caps;
}

EndpointCaps probe_endpoint(ucp_ep_h ep, const std::vector<std::string>& registering_domains) {
  return parse_endpoint_info(capture([&](FILE* f) { ucp_ep_print_info(ep, f); }),
                             registering_domains);
}

std::vector<std::string> domains_registering_host_memory() {
  std::vector<std::string> out;
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (uct_query_components(&components, &count) != UCS_OK) return out;
  for (unsigned c = 0; c < count; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> resources(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = resources.data();
    if (attr.md_resource_count == 0 || uct_component_query(components[c], &attr) != UCS_OK) {
      continue;
    }
    for (const auto& resource : resources) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t opened = uct_md_open(components[c], resource.md_name, config, &md);
      uct_config_release(config);
      if (opened != UCS_OK) continue;
      uct_md_attr_t md_attr{};
      if (uct_md_query(md, &md_attr) == UCS_OK && (md_attr.cap.flags & UCT_MD_FLAG_REG) &&
          (md_attr.cap.reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_HOST))) {
        add_unique(out, resource.md_name);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return out;
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
