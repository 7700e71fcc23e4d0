// common/curve_keys.h — the CURVE keys that authenticate and encrypt
// Baton's ZeroMQ sockets (docs/SECURITY.md).
//
// A key ring holds two key pairs, written by `baton keygen`: the server's
// (the router: its peers check they talk to it) and the one its clients
// share (the router admits only connections that prove they hold it). Two
// rings exist, each in a directory of its own, so that a holder of one
// cannot use the other:
//   the control plane (router.control_keys): router.pub/.key, node.pub/.key;
//     every host of the cluster needs a copy;
//   the ZeroMQ client front end (router.zmq_keys): router.pub/.key,
//     client.pub/.key; its clients need router.pub and the client pair.
// Secret files are mode 0600. With keys, nothing is accepted in the clear.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"

namespace baton::control {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

struct CurveKeys {
  CurveKeyPair server;
  CurveKeyPair client;
};

enum class KeyRing { kControl, kClients };

// The file stem of the ring's client pair: "node" or "client".
std::string_view client_key_name(KeyRing ring);

// Fresh key pairs into `dir` (made if missing). Refuses to overwrite keys.
Status write_curve_keys(const std::filesystem::path& dir, KeyRing ring);
// Reads and checks them: each file must hold a 40-character Z85 key, and
// each public key must be its secret key's. Errors name the file.
Result<CurveKeys> read_curve_keys(const std::filesystem::path& dir, KeyRing ring);
// What a client of the ring holds: router.pub and the client pair
// (router.key need not be there, and server.secret_key stays empty).
Result<CurveKeys> read_client_keys(const std::filesystem::path& dir, KeyRing ring);

}  // namespace baton::control
