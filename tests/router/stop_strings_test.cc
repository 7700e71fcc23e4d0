// Stop strings found in growing text, against std::string::find over the
// whole text at every step.
#include "router/stop_strings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

namespace baton::router {
namespace {

std::string random_text(std::mt19937& rng, size_t length, int alphabet) {
  std::string text;
  for (size_t i = 0; i < length; ++i) text.push_back(char('a' + int(rng() % unsigned(alphabet))));
  return text;
}

// One to four stop strings of one to seven letters.
std::vector<std::string> random_stops(std::mt19937& rng, int alphabet) {
  std::vector<std::string> stops(1 + rng() % 4);
  for (std::string& stop : stops) stop = random_text(rng, 1 + rng() % 7, alphabet);
  return stops;
}

// The earliest start of any stop string in `text`.
size_t naive_match(const std::string& text, const std::vector<std::string>& stops) {
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops) earliest = std::min(earliest, text.find(stop));
  return earliest;
}

// The longest end of `text` that begins a stop string (and is not all of one).
size_t naive_partial(const std::string& text, const std::vector<std::string>& stops) {
  size_t most = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(text.size(), stop.size() - 1); k > most; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        most = k;
        break;
      }
    }
  }
  return most;
}

// Text of two or three letters grown in random pieces, with stop strings
// drawn from the same letters (periodic ones like "aab" and "abab" among
// them, where a naive automaton would lose a match): after every piece the
// scan agrees with searching the whole text.
TEST(StopStringsTest, FindsWhatSearchingTheWholeTextFinds) {
  std::mt19937 rng{std::random_device{}()};
  int matches = 0;
  for (int round = 0; round < 3000; ++round) {
    const int alphabet = 2 + int(rng() % 2);
    const std::vector<std::string> stops = random_stops(rng, alphabet);
    const StopStrings strings(stops);
    StopStrings::Scan scan = strings.scan();
    std::string text;
    while (text.size() < 200) {
      text += random_text(rng, rng() % 9, alphabet);
      const size_t found = scan.feed(text);
      const size_t expected = naive_match(text, stops);
      ASSERT_EQ(found, expected) << "text '" << text << "'";
      ASSERT_EQ(scan.scanned(), text.size());
      if (found != std::string::npos) {
        ++matches;
        break;
      }
      ASSERT_EQ(scan.partial(), naive_partial(text, stops)) << "text '" << text << "'";
    }
  }
  EXPECT_GT(matches, 1000) << "the draws rarely matched: the test says little";
}

// Text passed over (what the first min_tokens tokens made) reports no
// match; fed text afterwards reports the earliest stop string that ends in
// it, one begun in the passed-over text included, as searching for matches
// that end past the boundary finds.
TEST(StopStringsTest, PassedOverTextCountsOnlyWhereAStringEndsAfterIt) {
  std::mt19937 rng{std::random_device{}()};
  int matches = 0, straddling = 0;
  for (int round = 0; round < 3000; ++round) {
    const int alphabet = 2 + int(rng() % 2);
    const std::vector<std::string> stops = random_stops(rng, alphabet);
    const StopStrings strings(stops);
    StopStrings::Scan scan = strings.scan();
    std::string text = random_text(rng, rng() % 40, alphabet);
    scan.pass_over(text);
    ASSERT_EQ(scan.scanned(), text.size());
    ASSERT_EQ(scan.partial(), naive_partial(text, stops)) << "text '" << text << "'";
    const size_t boundary = text.size();
    text += random_text(rng, 1 + rng() % 20, alphabet);
    size_t expected = std::string::npos;
    for (const std::string& stop : stops)
      for (size_t at = text.find(stop); at != std::string::npos; at = text.find(stop, at + 1))
        if (at + stop.size() > boundary) {
          expected = std::min(expected, at);
          break;
        }
    const size_t found = scan.feed(text);
    ASSERT_EQ(found, expected) << "text '" << text << "' passed over up to " << boundary;
    matches += found != std::string::npos;
    straddling += found != std::string::npos && found < boundary;
  }
  EXPECT_GT(matches, 1000) << "the draws rarely matched: the test says little";
  EXPECT_GT(straddling, 100) << "few matches began in the passed-over text";
}

// A restarted scan reads the (rewritten) text from its start.
TEST(StopStringsTest, ARestartedScanReadsEverythingAgain) {
  const StopStrings strings({"xyz"});
  StopStrings::Scan scan = strings.scan();
  EXPECT_EQ(scan.feed("abcxy"), std::string::npos);
  EXPECT_EQ(scan.partial(), 2u);
  scan.restart();
  EXPECT_EQ(scan.scanned(), 0u);
  EXPECT_EQ(scan.partial(), 0u);
  EXPECT_EQ(scan.feed("axyzb"), 1u);
}

// A long stop string costs each update the bytes it adds, not its length:
// a 4 MiB string against 64k one-byte updates would take minutes if each
// update searched a window of the string's length.
TEST(StopStringsTest, ALongStopStringCostsEachUpdateOnlyItsNewBytes) {
  std::string long_stop(size_t(4) << 20, 'a');
  long_stop.back() = 'b';
  const StopStrings strings({long_stop, "ab"});
  StopStrings::Scan scan = strings.scan();
  std::string text;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 65536; ++i) {
    text.push_back('a');
    ASSERT_EQ(scan.feed(text), std::string::npos);
  }
  EXPECT_EQ(scan.partial(), text.size()) << "all of it may begin the long string";
  text.push_back('b');
  EXPECT_EQ(scan.feed(text), text.size() - 2) << "\"ab\" ends the text";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace baton::router
