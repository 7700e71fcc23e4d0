// common/node_registration.cc — telling a RegisterAck that counts from a stale one.
#include "common/node_registration.h"

namespace baton::control {

NodeRegistration::Outcome NodeRegistration::on_ack(const RegisterAck& ack) {
  Outcome outcome;
  if (ack.accepted) {
    outcome.welcomed = !registered_.load();
    number_ = ack.registration;
    registered_ = true;
    return outcome;
  }
  // An answer to a heartbeat names the registration it was sent under: it
  // counts only against that registration, while it holds.
  if (ack.registration != 0 && (!registered_.load() || ack.registration != number_.load())) {
    return outcome;
  }
  // Registered, the node lost its registration; not registered, its
  // Register was refused (or an older router answered a heartbeat that
  // crossed it): the retry timer sends the next, not every answer.
  outcome.refused = true;
  outcome.lost = registered_.load();
  registered_ = false;
  return outcome;
}

}  // namespace baton::control
