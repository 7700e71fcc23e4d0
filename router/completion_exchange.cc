// router/completion_exchange.cc — choices, text, stop strings, SSE.
#include "router/completion_exchange.h"

#include <algorithm>
#include <numeric>

#include "router/api_error.h"
#include "router/incremental_text.h"

namespace baton::router {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Baton's extension to a choice: which nodes served it (clients ignore it).
json served_by(const auto& choice) {
  return {{"prefill", choice.prefill_node.empty() ? json(nullptr) : json(choice.prefill_node)},
          {"decode", choice.decode_node}};
}

}  // namespace

size_t complete_utf8_prefix(std::string_view text) {
  size_t n = text.size();
  // Look back at most 3 bytes for the lead byte of a sequence that is cut off.
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    auto byte = static_cast<unsigned char>(text[n - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return length > back ? n - back : n;
  }
  return n;
}

CompletionExchange::CompletionExchange(ExchangeSpec spec, std::shared_ptr<HttpResponder> responder,
                                       RouterCore& core, const engine::Tokenizer* tokenizer,
                                       RouterMetrics& metrics, RequestWorkers& workers)
    : spec_(std::move(spec)),
      responder_(std::move(responder)),
      core_(core),
      tokenizer_(tokenizer),
      metrics_(metrics),
      workers_(workers),
      arrival_(spec_.arrival),
      stops_(spec_.stop) {}

void CompletionExchange::start(std::vector<GenerationRequest> choices) {
  std::weak_ptr<CompletionExchange> weak = weak_from_this();
  responder_->on_close([weak] {
    if (auto self = weak.lock()) self->on_client_gone();
  });
  std::lock_guard lock(mutex_);
  // A client gone before this ran (its request waited for a worker) ran
  // on_client_gone already: nothing is submitted, so nothing is left running.
  if (done_) return;
  choices_.resize(choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    // The prompt's last tokens: the context the output is read after.
    const auto& prompt = choices[i].prompt;
    choices_[i].prompt_tokens = int64_t(prompt.size());
    choices_[i].max_tokens = choices[i].sampling.max_tokens;
    choices_[i].min_tokens = choices[i].sampling.min_tokens;
    choices_[i].stop_scan = stops_.scan();
    const size_t lead = std::min(prompt.size(), kDetokenizeContextTokens);
    choices_[i].lead.assign(prompt.end() - ptrdiff_t(lead), prompt.end());
    if (choices[i].sampling.prompt_logprobs >= 0) choices_[i].prompt = prompt;
    auto sink = [self = shared_from_this(), i](const GenerationUpdate& update) {
      self->on_update(i, update);
    };
    Result<uint64_t> id = core_.submit(std::move(choices[i]), std::move(sink));
    if (!id.is_ok()) return fail(id.status());
    choices_[i].request_id = *id;
    choices_[i].submitted = true;
    if (done_) return;  // the client left meanwhile
  }
}

void CompletionExchange::on_client_gone() {
  std::lock_guard lock(mutex_);
  if (done_) return;
  done_ = true;
  // Every choice still running ends as vLLM counts a dropped request; one
  // that ended while its prompt part was built was not counted yet.
  for (const ChoiceState& choice : choices_) {
    if (!choice.finished) metrics_.count_finished(FinishReason::kAborted);
    if (choice.finished && choice.building_prompt_part)
      metrics_.count_finished(choice.finish_reason);
  }
  cancel_running();
}

void CompletionExchange::on_update(size_t index, const GenerationUpdate& update) {
  bool build = false;
  {
    std::lock_guard lock(mutex_);
    try {
      build = take_update(index, update);
    } catch (const std::exception& e) {
      // A reply that cannot be built (out of memory, a bug) ends with an
      // error here: a choice it marked finished would ignore the core's
      // failure, and the client would wait for ever.
      if (!done_) fail(internal_error(std::string("building the reply failed: ") + e.what()));
    }
  }
  // Not under the mutex: a stopped pool runs the work here, and it locks.
  if (build) workers_.post([self = shared_from_this(), index] { self->build_prompt_part(index); });
}

bool CompletionExchange::take_update(size_t index, const GenerationUpdate& update) {
  if (done_ || index >= choices_.size() || choices_[index].finished) return false;
  ChoiceState& choice = choices_[index];
  choice.decode_node = update.decode_node;
  choice.prefill_node = update.prefill_node;
  auto now = Clock::now();
  // A node that sends more than was asked for is broken or hostile: its
  // tokens are not kept (nor the memory they would take).
  if (int64_t(choice.tokens.size() + update.tokens.size()) > choice.max_tokens ||
      update.logprobs.size() > update.tokens.size() ||
      update.prompt_logprobs.size() > size_t(choice.prompt_tokens)) {
    fail(internal_error("node " + update.decode_node + " sent more tokens than the " +
                        std::to_string(choice.max_tokens) + " asked for"));
    return false;
  }
  if (!update.tokens.empty()) {
    if (!choice.got_token) {
      metrics_.observe_ttft(seconds_between(arrival_, now));
      if (update.prefill_seconds >= 0)
        metrics_.observe_queue_and_prefill(update.queue_seconds, update.prefill_seconds);
      choice.prefill_seconds = update.prefill_seconds;
      choice.cached_tokens = std::clamp<int64_t>(update.cached_tokens, 0, choice.prompt_tokens);
      choice.first_token = now;
    } else {
      double gap = seconds_between(choice.last_token, now) / double(update.tokens.size());
      for (size_t t = 0; t < update.tokens.size(); ++t) metrics_.observe_itl(gap);
    }
    choice.got_token = true;
    choice.last_token = now;
    // Counted as they arrive (as vLLM does), so aborted work shows too.
    metrics_.count_tokens(0, int64_t(update.tokens.size()));
    choice.tokens.insert(choice.tokens.end(), update.tokens.begin(), update.tokens.end());
    choice.logprobs.insert(choice.logprobs.end(), update.logprobs.begin(), update.logprobs.end());
    if (!update.prompt_logprobs.empty()) choice.prompt_logprobs = update.prompt_logprobs;
  }
  if (update.finished) {
    if (update.finish_reason == FinishReason::kError) {
      fail(update.error);
      return false;
    }
    choice.finished = true;
    choice.finish_reason = update.finish_reason;
  }
  const size_t visible = update_text(choice);
  // The first chunk of a streamed echo with log-probabilities carries the
  // prompt's: as many entries as the prompt has tokens, times the
  // alternatives, which a worker builds while this thread serves the other
  // requests. The choice's chunks wait for it.
  if (spec_.stream && !choice.sent_chunk && !choice.prompt_part) {
    if (choice.building_prompt_part) return false;
    if (!choice.prompt.empty() && choice.scored() > 0) {
      choice.building_prompt_part = true;
      return true;
    }
  }
  emit(index, choice, visible);
  return false;
}

void CompletionExchange::build_prompt_part(size_t index) {
  std::vector<int32_t> prompt;
  std::vector<control::TokenLogprobs> scored;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    prompt = std::move(choices_[index].prompt);
    scored = std::move(choices_[index].prompt_logprobs);
  }
  std::optional<json> part;
  std::string error;
  try {
    part = prompt_part(prompt, scored);
  } catch (const std::exception& e) {
    error = e.what();  // out of memory, most likely: what this is done off the core for
  }
  std::lock_guard lock(mutex_);
  if (done_) return;
  try {
    if (!part) throw std::runtime_error(error);
    ChoiceState& choice = choices_[index];
    choice.prompt_part = std::move(part);
    choice.building_prompt_part = false;
    emit(index, choice, update_text(choice));
  } catch (const std::exception& e) {
    if (!done_) fail(internal_error(std::string("building the reply failed: ") + e.what()));
  }
}

void CompletionExchange::emit(size_t index, ChoiceState& choice, size_t visible) {
  if (spec_.stream) stream_delta(index, choice, visible);
  if (!choice.finished) return;
  const auto now = Clock::now();
  ++finished_count_;
  metrics_.observe_e2e(seconds_between(arrival_, now));
  metrics_.observe_request(choice.prompt_tokens, int64_t(choice.tokens.size()),
                           choice.got_token ? seconds_between(choice.first_token, now) : 0.0,
                           choice.prefill_seconds);
  metrics_.count_finished(choice.finish_reason);
  if (finished_count_ == choices_.size()) finish_exchange();
}

std::string CompletionExchange::detokenize(const std::vector<int32_t>& tokens) const {
  if (tokenizer_ != nullptr) return tokenizer_->decode(tokens);
  std::string text;
  for (int32_t id : tokens) text += "<|" + std::to_string(id) + "|>";
  return text;
}

size_t CompletionExchange::update_text(ChoiceState& choice) {
  // Only the new tokens are decoded, and only the new text is searched (the
  // scan carries what a stop string starting earlier matched so far): each
  // update costs what it adds, not what the output has grown to.
  const bool appended = append_decoded(
      choice.tokens, choice.decoded, choice.text,
      [this](const auto& ids) { return detokenize(ids); }, choice.lead);
  size_t match = std::string::npos;
  if (!stops_.empty()) {
    StopStrings::Scan& scan = *choice.stop_scan;
    if (!appended) scan.restart();
    // As vLLM: stop strings count once the output has more than min_tokens
    // tokens, and only where they end in text those tokens added.
    if (int64_t(choice.tokens.size()) <= choice.min_tokens) {
      scan.pass_over(choice.text);
    } else {
      if (choice.stops_from < 0) choice.stops_from = int64_t(scan.scanned());
      const std::string_view text = choice.text;
      // After a restart, the text before the boundary is read again first.
      if (scan.scanned() < size_t(choice.stops_from))
        scan.pass_over(text.substr(0, std::min(size_t(choice.stops_from), text.size())));
      match = scan.feed(text);
    }
  }
  if (match != std::string::npos) {
    choice.text.resize(match);
    if (!choice.finished) core_.cancel(choice.request_id);
    choice.finished = true;
    choice.finish_reason = FinishReason::kStop;
  }
  if (choice.finished) return choice.text.size();
  // The text's end that begins a stop string is held back until the string
  // is complete (the choice stops there) or cannot be.
  const size_t hold = stops_.empty() ? 0 : choice.stop_scan->partial();
  const std::string_view text = choice.text;
  const size_t visible = complete_utf8_prefix(text.substr(0, text.size() - hold));
  return std::max(visible, choice.emitted);
}

void CompletionExchange::stream_delta(size_t index, ChoiceState& choice, size_t visible) {
  if (!stream_started_) {
    responder_->start_stream(200);
    stream_started_ = true;
  }
  // Text decoded again in full may be shorter than what went out already.
  const size_t from = std::min(choice.emitted, choice.text.size());
  const size_t to = std::clamp(visible, from, choice.text.size());
  std::string delta = choice.text.substr(from, to - from);
  // echo: the prompt's text opens the choice's first chunk.
  if (!choice.sent_chunk) delta.insert(0, echo_of(index));
  // Log-probabilities go out with the chunk after their token arrives, even
  // while its text is held back (UTF-8, stop strings), as vLLM streams them.
  const size_t scored = choice.scored();
  const bool new_logprobs = scored > choice.logprobs_sent;
  if (delta.empty() && !choice.finished && choice.sent_chunk && !new_logprobs) return;
  json chunk = stream_chunk(spec_.endpoint, spec_.id, spec_.model, spec_.created, int32_t(index),
                            delta, choice.finished ? choice.finish_reason : FinishReason::kNone,
                            !choice.sent_chunk);
  if (new_logprobs) {
    const bool first = !choice.sent_chunk;
    if (first) choice.logprobs_text_offset = echo_of(index).size();
    json logprobs =
        logprobs_json(choice, choice.logprobs_sent, scored, choice.logprobs_text_offset);
    if (first && choice.prompt_part) {
      logprobs = with_prompt_part(std::move(*choice.prompt_part), std::move(logprobs));
      choice.prompt_part.reset();
    }
    chunk["choices"][0]["logprobs"] = std::move(logprobs);
    choice.logprobs_sent = scored;
  }
  if (choice.finished) chunk["choices"][0]["served_by"] = served_by(choice);
  responder_->write(sse_event(chunk));
  choice.sent_chunk = true;
  choice.emitted = std::max(choice.emitted, to);
}

std::string CompletionExchange::token_text(int32_t id) const {
  return json::parse(dump(json(detokenize({id})))).get<std::string>();
}

std::string CompletionExchange::token_name(int32_t id, const std::string& text) const {
  return spec_.tokens_as_ids ? "token_id:" + std::to_string(id) : text;
}

size_t CompletionExchange::alternatives_shown(const control::TokenLogprobs& scored) const {
  return std::min(scored.top_ids.size(), size_t(std::max(spec_.top_logprobs, 0)));
}

json CompletionExchange::top_map(int32_t id, const control::TokenLogprobs& scored) const {
  json top = json::object();
  for (size_t k = 0; k < alternatives_shown(scored); ++k) {
    // Alternatives that render as the same text share a key: keep the likeliest.
    const int32_t alt = scored.top_ids[k];
    std::string key = token_name(alt, token_text(alt));
    if (!top.contains(key) || top[key].get<float>() < scored.top_logprobs[k])
      top[key] = scored.top_logprobs[k];
  }
  if (std::string key = token_name(id, token_text(id)); !top.contains(key))
    top[key] = scored.logprob;
  return top;
}

json CompletionExchange::logprobs_json(const ChoiceState& choice, size_t begin, size_t end,
                                       size_t& text_offset) const {
  auto bytes_of = [](const std::string& text) {
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(int(c));
    return bytes;
  };
  if (spec_.endpoint == Endpoint::kChatCompletions) {
    json content = json::array();
    for (size_t t = begin; t < end; ++t) {
      const control::TokenLogprobs& lp = choice.logprobs[t];
      json top = json::array();
      for (size_t k = 0; k < alternatives_shown(lp); ++k) {
        const int32_t alt = lp.top_ids[k];
        const std::string alt_text = token_text(alt);
        top.push_back({{"token", token_name(alt, alt_text)},
                       {"logprob", lp.top_logprobs[k]},
                       {"bytes", bytes_of(alt_text)}});
      }
      const std::string text = token_text(choice.tokens[t]);
      content.push_back({{"token", token_name(choice.tokens[t], text)},
                         {"logprob", lp.logprob},
                         {"bytes", bytes_of(text)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset_list = json::array();
  for (size_t t = begin; t < end; ++t) {
    const control::TokenLogprobs& lp = choice.logprobs[t];
    const std::string text = token_text(choice.tokens[t]);
    tokens.push_back(token_name(choice.tokens[t], text));
    token_logprobs.push_back(lp.logprob);
    top_logprobs.push_back(top_map(choice.tokens[t], lp));
    // Offsets in the choice's text, whatever names the tokens.
    text_offset_list.push_back(text_offset);
    text_offset += text.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset_list}};
}

json CompletionExchange::prompt_part(const std::vector<int32_t>& prompt,
                                     const std::vector<control::TokenLogprobs>& scored) const {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  size_t offset = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    // The first token has no context to be scored in; a node that sent
    // fewer scores than tokens leaves the rest null too.
    const control::TokenLogprobs* lp = p > 0 && p - 1 < scored.size() ? &scored[p - 1] : nullptr;
    const std::string text = token_text(prompt[p]);
    tokens.push_back(token_name(prompt[p], text));
    text_offset.push_back(offset);
    offset += text.size();
    if (lp == nullptr) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(lp->logprob);
    top_logprobs.push_back(top_map(prompt[p], *lp));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

json CompletionExchange::with_prompt_part(json part, json logprobs) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (json& item : logprobs[key]) part[key].push_back(std::move(item));
    logprobs[key] = std::move(part[key]);
  }
  return logprobs;
}

void CompletionExchange::finish_exchange() {
  done_ = true;
  Usage usage;
  usage.prompt_tokens = spec_.prompt_tokens;
  for (const ChoiceState& choice : choices_)
    usage.completion_tokens += int64_t(choice.tokens.size());
  // Each prompt once, as prompt_tokens counts it: what the cache held before
  // this request, the least any of its generations found (the first to
  // compute it may leave its blocks to the others).
  const size_t per_prompt = size_t(std::max(spec_.best_of, 1));
  for (size_t first = 0; first < choices_.size(); first += per_prompt) {
    int64_t least = choices_[first].cached_tokens;
    for (size_t i = first + 1; i < std::min(first + per_prompt, choices_.size()); ++i)
      least = std::min(least, choices_[i].cached_tokens);
    usage.cached_tokens += least;
  }
  metrics_.count_tokens(spec_.prompt_tokens, 0);
  if (spec_.stream) {
    if (spec_.include_usage) {
      responder_->write(
          sse_event(usage_chunk(spec_.endpoint, spec_.id, spec_.model, spec_.created, usage)));
    }
    responder_->write(std::string(kSseDone));
    responder_->finish();
    return;
  }
  // Seconds for many choices with log-probabilities: not on the core
  // thread, which every other request's tokens pass through.
  workers_.post([self = shared_from_this(), usage] { self->send_reply(usage); });
}

void CompletionExchange::send_reply(const Usage& usage) {
  if (responder_->closed()) return;  // nobody to read it
  const std::vector<size_t> returned = returned_choices();
  std::vector<Choice> choices;
  for (size_t i = 0; i < returned.size(); ++i) {
    const ChoiceState& c = choices_[returned[i]];
    choices.push_back({int32_t(i), std::string(echo_of(returned[i])) + c.text, c.finish_reason});
  }
  json body =
      completion_response(spec_.endpoint, spec_.id, spec_.model, spec_.created, choices, usage);
  for (size_t i = 0; i < returned.size(); ++i) {
    const ChoiceState& c = choices_[returned[i]];
    body["choices"][i]["served_by"] = served_by(c);
    if (spec_.logprobs && !c.logprobs.empty()) {
      size_t offset = echo_of(returned[i]).size();
      json logprobs = logprobs_json(c, 0, c.scored(), offset);
      body["choices"][i]["logprobs"] =
          c.prompt.empty()
              ? logprobs
              : with_prompt_part(prompt_part(c.prompt, c.prompt_logprobs), std::move(logprobs));
    }
  }
  responder_->respond(200, "application/json", dump(body));
}

std::string_view CompletionExchange::echo_of(size_t index) const {
  const size_t prompt = index / size_t(std::max(spec_.best_of, 1));
  return prompt < spec_.echoes.size() ? std::string_view(spec_.echoes[prompt]) : std::string_view();
}

std::vector<size_t> CompletionExchange::returned_choices() const {
  std::vector<size_t> returned(choices_.size());
  std::iota(returned.begin(), returned.end(), size_t(0));
  if (spec_.best_of <= spec_.n) return returned;
  std::vector<double> cumulative(choices_.size(), 0.0);
  for (size_t i = 0; i < choices_.size(); ++i)
    for (const control::TokenLogprobs& t : choices_[i].logprobs) cumulative[i] += double(t.logprob);
  returned.clear();
  const auto best_of = size_t(spec_.best_of);
  for (size_t first = 0; first < choices_.size(); first += best_of) {
    std::vector<size_t> group(best_of);
    std::iota(group.begin(), group.end(), first);
    // Highest first; among equals, the earlier sample.
    std::stable_sort(group.begin(), group.end(),
                     [&](size_t a, size_t b) { return cumulative[a] > cumulative[b]; });
    returned.insert(returned.end(), group.begin(), group.begin() + spec_.n);
  }
  return returned;
}

void CompletionExchange::fail(const Status& error) {
  done_ = true;
  // Each choice still running ends in the error, as each finished one
  // counts; those never submitted (admission refused) never ran.
  for (const ChoiceState& choice : choices_) {
    if (choice.submitted && !choice.finished) metrics_.count_finished(FinishReason::kError);
    if (choice.finished && choice.building_prompt_part)
      metrics_.count_finished(choice.finish_reason);  // ended meanwhile, not counted yet
  }
  cancel_running();
  ApiError api = api_error_from_status(error);
  if (stream_started_) {
    responder_->write(sse_event(api.to_json()));
    responder_->write(std::string(kSseDone));
    responder_->finish();
    return;
  }
  std::vector<std::pair<std::string, std::string>> headers;
  if (api.http_status == 429 || api.http_status == 503) headers.emplace_back("Retry-After", "1");
  responder_->respond(api.http_status, "application/json", dump(api.to_json()), std::move(headers));
}

void CompletionExchange::cancel_running() {
  for (ChoiceState& choice : choices_) {
    if (choice.submitted && !choice.finished) core_.cancel(choice.request_id);
    choice.finished = true;
  }
}

}  // namespace baton::router
