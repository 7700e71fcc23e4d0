// libFuzzer target: a cluster YAML as `baton up` and every role read it.
// yaml-cpp's own syntax errors are its exceptions, which the loader turns
// into an error naming the file; past that, reading the document into a
// ClusterConfig must give a config or an error, never an exception or a
// crash, whatever the document's shape (a map where a number belongs,
// aliases, huge numbers).
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "cluster/cluster_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const YAML::Exception&) {
    return 0;  // load_cluster_config: "FILE: <yaml-cpp's message>"
  }
  (void)baton::cluster::parse_cluster_config(root, "/cluster");
  return 0;
}
