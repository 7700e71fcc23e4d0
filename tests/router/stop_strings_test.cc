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

// The earliest start of a stop string in `text` that ends past `boundary`.
size_t naive_match_past(const std::string& text, const std::vector<std::string>& stops,
                        size_t boundary) {
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops)
    for (size_t at = text.find(stop); at != std::string::npos; at = text.find(stop, at + 1))
      if (at + stop.size() > boundary) {
        earliest = std::min(earliest, at);
        break;
      }
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

// One random draw: an alphabet of two or three letters, stop strings of
// its letters (periodic ones like "aab" and "abab" among them, where a
// naive automaton would lose a match) and a fresh scan of them.
struct Draw {
  std::mt19937& rng;
  int alphabet;
  const std::vector<std::string>& stops;
  StopStrings::Scan& scan;
  std::string text(size_t length) const { return random_text(rng, length, alphabet); }
};

// Runs `check` over 3000 draws; it sets the match its scan reported (npos:
// none). Fails where few matched: the draws would then say little.
template <typename Check>
void over_random_draws(Check&& check) {
  std::mt19937 rng{std::random_device{}()};
  int matches = 0;
  for (int round = 0; round < 3000 && !::testing::Test::HasFatalFailure(); ++round) {
    const int alphabet = 2 + int(rng() % 2);
    const std::vector<std::string> stops = random_stops(rng, alphabet);
    const StopStrings strings(stops);
    StopStrings::Scan scan = strings.scan();
    size_t found = std::string::npos;
    check(Draw{rng, alphabet, stops, scan}, found);
    matches += found != std::string::npos;
  }
  EXPECT_GT(matches, 1000) << "the draws rarely matched: the test says little";
}

// Text grown in random pieces: after every piece the scan agrees with
// searching the whole text.
TEST(StopStringsTest, FindsWhatSearchingTheWholeTextFinds) {
  over_random_draws([](const Draw& d, size_t& found) {
    std::string text;
    while (text.size() < 200) {
      text += d.text(d.rng() % 9);
      found = d.scan.feed(text);
      ASSERT_EQ(found, naive_match(text, d.stops)) << "text '" << text << "'";
      ASSERT_EQ(d.scan.scanned(), text.size());
      if (found != std::string::npos) break;
      ASSERT_EQ(d.scan.partial(), naive_partial(text, d.stops)) << "text '" << text << "'";
    }
  });
}

// Text passed over (what the first min_tokens tokens made) reports no
// match; fed text afterwards reports the earliest stop string that ends in
// it, one begun in the passed-over text included, as searching for matches
// that end past the boundary finds.
TEST(StopStringsTest, PassedOverTextCountsOnlyWhereAStringEndsAfterIt) {
  int straddling = 0;
  over_random_draws([&](const Draw& d, size_t& found) {
    std::string text = d.text(d.rng() % 40);
    d.scan.pass_over(text);
    ASSERT_EQ(d.scan.scanned(), text.size());
    ASSERT_EQ(d.scan.partial(), naive_partial(text, d.stops)) << "text '" << text << "'";
    const size_t boundary = text.size();
    text += d.text(1 + d.rng() % 20);
    found = d.scan.feed(text);
    ASSERT_EQ(found, naive_match_past(text, d.stops, boundary))
        << "text '" << text << "' passed over up to " << boundary;
    straddling += found != std::string::npos && found < boundary;
  });
  EXPECT_GT(straddling, 100) << "few matches began in the passed-over text";
}

// As the exchange calls it at every update past min_tokens: the text up to
// the boundary passed over (again, a no-op once read), then the whole text
// fed. Found: the earliest stop string ending past the boundary, as
// searching the whole text finds, update after update (once, passing over
// the shorter text moved the scan back, and every update read the output
// from the boundary again with a stale state).
TEST(StopStringsTest, PassingOverTheBoundaryAtEveryUpdateReadsEachByteOnce) {
  over_random_draws([](const Draw& d, size_t& found) {
    std::string text = d.text(d.rng() % 10);
    const size_t boundary = text.size();
    d.scan.pass_over(text);
    while (text.size() < 120 && found == std::string::npos) {
      text += d.text(1 + d.rng() % 6);
      d.scan.pass_over(std::string_view(text).substr(0, boundary));
      found = d.scan.feed(text);
      ASSERT_EQ(d.scan.scanned(), text.size());
      ASSERT_EQ(found, naive_match_past(text, d.stops, boundary))
          << "text '" << text << "' past " << boundary;
    }
  });
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
