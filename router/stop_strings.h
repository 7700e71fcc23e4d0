// router/stop_strings.h — finding a request's stop strings in text that
// grows at its end, in time linear in the text.
//
// Searching the whole output again at every update costs O(n^2) over a long
// output, and searching only the new text plus the longest stop string's
// length before it still costs that length at every update: a client's
// megabyte-long stop string would make every token of its output cost a
// megabyte on the router's dispatcher thread. Each stop string gets a
// Knuth-Morris-Pratt automaton instead, which reads every byte of the text
// once; its state (the longest prefix of the string the text ends with) is
// also exactly what a stream must hold back, no more.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace baton::router {

// The stop strings of a request: non-empty, shared by its choices.
class StopStrings {
 public:
  explicit StopStrings(const std::vector<std::string>& stops);
  bool empty() const { return stops_.empty(); }

  // Where one choice's text stands against the stop strings.
  class Scan {
   public:
    // Reads text[scanned(), text.size()): the earliest start of a stop
    // string that ends in it, or npos. After a match the scan is spent
    // (the text is cut there); text[0, scanned()) must be what it read
    // before, else restart().
    size_t feed(std::string_view text);
    // Reads text[scanned(), text.size()) as feed does but reports no match:
    // text in which a stop string does not count yet (min_tokens). A stop
    // string that begins in it and ends in text fed later still counts.
    void pass_over(std::string_view text);
    void restart();
    size_t scanned() const { return scanned_; }
    // Bytes at the end of the text read so far that begin some stop string:
    // a stream holds them back until the string is complete or cannot be.
    size_t partial() const;

   private:
    friend class StopStrings;
    explicit Scan(const StopStrings* stops);
    size_t read(std::string_view text, bool report);
    const StopStrings* stops_;
    std::vector<uint32_t> matched_;  // per stop string: its prefix the text ends with
    size_t scanned_ = 0;
  };
  Scan scan() const { return Scan(this); }

 private:
  struct Stop {
    std::string text;
    // failure[i]: the longest proper prefix of text[0, i] that is also its
    // suffix (Knuth-Morris-Pratt).
    std::vector<uint32_t> failure;
  };
  std::vector<Stop> stops_;
};

}  // namespace baton::router
