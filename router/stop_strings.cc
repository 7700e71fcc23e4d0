// router/stop_strings.cc — Knuth-Morris-Pratt automata for stop strings.
#include "router/stop_strings.h"

#include <algorithm>

namespace baton::router {

StopStrings::StopStrings(const std::vector<std::string>& stops) {
  stops_.reserve(stops.size());
  for (const std::string& text : stops) {
    Stop stop{text, std::vector<uint32_t>(text.size(), 0)};
    uint32_t k = 0;
    for (size_t i = 1; i < text.size(); ++i) {
      while (k > 0 && text[i] != text[k]) k = stop.failure[k - 1];
      if (text[i] == text[k]) ++k;
      stop.failure[i] = k;
    }
    stops_.push_back(std::move(stop));
  }
}

StopStrings::Scan::Scan(const StopStrings* stops)
    : stops_(stops), matched_(stops->stops_.size(), 0) {}

void StopStrings::Scan::restart() {
  std::fill(matched_.begin(), matched_.end(), 0);
  scanned_ = 0;
}

size_t StopStrings::Scan::partial() const {
  uint32_t most = 0;
  for (uint32_t m : matched_) most = std::max(most, m);
  return most;
}

size_t StopStrings::Scan::feed(std::string_view text) { return read(text, /*report=*/true); }

void StopStrings::Scan::pass_over(std::string_view text) { read(text, /*report=*/false); }

size_t StopStrings::Scan::read(std::string_view text, bool report) {
  // Text no longer than what was read adds nothing (and must not move the
  // scan back).
  if (text.size() <= scanned_) return std::string_view::npos;
  // A string that ends at byte i starts at i + 1 - its length: one ending
  // later may start earlier, so every new byte is read before answering.
  size_t earliest = std::string_view::npos;
  for (size_t s = 0; s < matched_.size(); ++s) {
    const Stop& stop = stops_->stops_[s];
    uint32_t m = matched_[s];
    for (size_t i = scanned_; i < text.size(); ++i) {
      while (m > 0 && text[i] != stop.text[m]) m = stop.failure[m - 1];
      if (text[i] == stop.text[m]) ++m;
      if (m == stop.text.size()) {
        if (report) {
          earliest = std::min(earliest, i + 1 - m);
          break;  // its first match in the new text; later ones start later
        }
        m = stop.failure[m - 1];  // not counted: go on as after a mismatch
      }
    }
    matched_[s] = m;
  }
  scanned_ = text.size();
  return earliest;
}

}  // namespace baton::router
