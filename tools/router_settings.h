// tools/router_settings.h — the router's settings from a cluster YAML: its
// `router:` mapping, the model, and the nodes it expects.
#pragma once

#include "cluster/cluster_config.h"
#include "common/status.h"
#include "router/router_server.h"

namespace baton::tools {

// Reads the key files the config names (API keys, CURVE keys); an error
// names the key.
Result<router::RouterSettings> router_settings(const cluster::ClusterConfig& config);

}  // namespace baton::tools
