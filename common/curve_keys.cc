#include "common/curve_keys.h"

#include <sys/stat.h>
#include <zmq.h>

#include <array>
#include <fstream>

#include "common/regular_file.h"

namespace baton::control {
namespace {

namespace fs = std::filesystem;
constexpr size_t kZ85KeyChars = 40;

Status write_key(const fs::path& path, const std::string& key, bool secret) {
  {
    std::ofstream out(path, std::ios::trunc);
    if (!out) return io_error("cannot write " + path.string());
    out << key << "\n";
    if (!out) return io_error("cannot write " + path.string());
  }
  if (::chmod(path.c_str(), secret ? 0600 : 0644) != 0) {
    return io_error("cannot set the mode of " + path.string());
  }
  return Status::ok();
}

Result<std::string> read_key(const fs::path& path) {
  BATON_RETURN_IF_ERROR(check_regular_file(path));
  std::ifstream in(path);
  if (!in) return not_found("cannot open " + path.string());
  std::string key;
  std::getline(in, key);
  while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
  std::array<uint8_t, 32> decoded{};
  if (key.size() != kZ85KeyChars || zmq_z85_decode(decoded.data(), key.c_str()) == nullptr) {
    return data_loss(path.string() + ": not a CURVE key (40 Z85 characters)");
  }
  return key;
}

Result<CurveKeyPair> read_pair(const fs::path& dir, const std::string& name) {
  CurveKeyPair pair;
  BATON_ASSIGN_OR_RETURN(pair.public_key, read_key(dir / (name + ".pub")));
  BATON_ASSIGN_OR_RETURN(pair.secret_key, read_key(dir / (name + ".key")));
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, pair.secret_key.c_str()) != 0 || pair.public_key != derived) {
    return data_loss((dir / (name + ".pub")).string() + " is not the public key of " +
                     (dir / (name + ".key")).string());
  }
  return pair;
}

}  // namespace

std::string_view client_key_name(KeyRing ring) {
  return ring == KeyRing::kControl ? "node" : "client";
}

Status write_curve_keys(const fs::path& dir, KeyRing ring) {
  if (zmq_has("curve") == 0) return unimplemented("this libzmq was built without CURVE");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("cannot make " + dir.string() + ": " + ec.message());
  const std::string names[] = {"router", std::string(client_key_name(ring))};
  for (const std::string& name : names) {
    for (const char* suffix : {".pub", ".key"}) {
      if (fs::exists(dir / (name + suffix))) {
        return invalid_argument((dir / (name + suffix)).string() +
                                " exists; keygen does not overwrite keys");
      }
    }
  }
  for (const std::string& name : names) {
    char public_key[kZ85KeyChars + 1], secret_key[kZ85KeyChars + 1];
    if (zmq_curve_keypair(public_key, secret_key) != 0) {
      return internal_error("zmq_curve_keypair failed");
    }
    BATON_RETURN_IF_ERROR(write_key(dir / (name + ".key"), secret_key, true));
    BATON_RETURN_IF_ERROR(write_key(dir / (name + ".pub"), public_key, false));
  }
  return Status::ok();
}

Result<CurveKeys> read_curve_keys(const fs::path& dir, KeyRing ring) {
  if (zmq_has("curve") == 0) return unimplemented("this libzmq was built without CURVE");
  CurveKeys keys;
  BATON_ASSIGN_OR_RETURN(keys.server, read_pair(dir, "router"));
  BATON_ASSIGN_OR_RETURN(keys.client, read_pair(dir, std::string(client_key_name(ring))));
  return keys;
}

Result<CurveKeys> read_client_keys(const fs::path& dir, KeyRing ring) {
  if (zmq_has("curve") == 0) return unimplemented("this libzmq was built without CURVE");
  CurveKeys keys;
  BATON_ASSIGN_OR_RETURN(keys.server.public_key, read_key(dir / "router.pub"));
  BATON_ASSIGN_OR_RETURN(keys.client, read_pair(dir, std::string(client_key_name(ring))));
  return keys;
}

}  // namespace baton::control
