// common/node_registration.h — a node's registration with the router, and
// what each of the router's RegisterAcks means for it.
//
// The router answers a Register (a welcome naming the registration, or a
// refusal) and every heartbeat of a node it does not hold up ("register
// again", naming the registration the heartbeat was sent under). Heartbeats
// come from a thread of their own, so several may cross a Register: an
// answer to one sent under an earlier registration, or one that arrives
// while the node is already registering again, is stale. Acting on it would
// register the node a second time, which the router takes for a restart,
// failing the requests it had just given the node.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/control_messages.h"

namespace baton::control {

class NodeRegistration {
 public:
  struct Outcome {
    bool welcomed = false;  // newly registered
    bool refused = false;   // a refusal that counts (not a stale answer)
    // The router failed this node's requests or never knew them: the node
    // drops everything it holds and registers again at once.
    bool lost = false;
  };

  // On the node's loop thread.
  Outcome on_ack(const RegisterAck& ack);
  // Any thread (the heartbeat thread reads both).
  bool registered() const { return registered_.load(); }
  uint64_t number() const { return number_.load(); }  // the last welcome's; 0: none yet

 private:
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> number_{0};
};

}  // namespace baton::control
