// common/control_keys.h — the CURVE keys that authenticate and encrypt the
// control plane (docs/SECURITY.md).
//
// A keyed cluster has two key pairs, written by `baton keygen DIR`: the
// router's (nodes check they talk to it) and the nodes' (the router admits
// only connections that prove they hold it). The directory holds
// router.pub, router.key, node.pub and node.key (secret files mode 0600);
// the cluster YAML names it as router.control_keys, and every host of the
// cluster needs a copy. With keys, nothing reaches the control socket in
// the clear.
#pragma once

#include <filesystem>
#include <string>

#include "common/status.h"

namespace baton::control {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

struct ControlKeys {
  CurveKeyPair router;
  CurveKeyPair node;
};

// Fresh key pairs into `dir` (made if missing). Refuses to overwrite keys.
Status write_control_keys(const std::filesystem::path& dir);
// Reads and checks them: each file must hold a 40-character Z85 key, and
// each public key must be its secret key's. Errors name the file.
Result<ControlKeys> read_control_keys(const std::filesystem::path& dir);

}  // namespace baton::control
