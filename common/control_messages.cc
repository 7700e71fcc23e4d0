// common/control_messages.cc — MessagePack codec of the control messages.
#include "common/control_messages.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace baton::control {
namespace {

using json = nlohmann::json;

// Deepest nesting any valid message has (Events: map > list > map > list) plus slack.
constexpr size_t kMaxDepth = 8;

// Builds the DOM like nlohmann's own SAX parser but refuses nesting past
// kMaxDepth before descending (the MessagePack reader recurses per level, so
// a frame of nested one-element arrays would otherwise exhaust the stack).
// It also bounds a frame's shape while it is decoded, before any of it is built in
// full: nesting, the entries a list or map declares, and the values and maps
// of the whole frame, so a hostile frame within kMaxMessageBytes costs the
// decoder what a legitimate one can, not gigabytes. The largest legitimate
// frames are a generate message (a whole prompt and its block list) and an
// events message (kMaxEventsPerMessage events, each with a few maps).
class BoundedSax : public nlohmann::detail::json_sax_dom_parser<json> {
 public:
  static constexpr size_t kMaxListEntries = std::max(kMaxPromptTokens, kMaxBlocksPerRequest);
  // A heartbeat's kv_paths: one entry per decode node.
  static constexpr size_t kMaxMapEntries = kMaxKvPaths;
  static constexpr size_t kMaxValues = kMaxFrameValues;
  static constexpr size_t kMaxMaps = kMaxFrameMaps;

  explicit BoundedSax(json& root) : json_sax_dom_parser(root, /*allow_exceptions=*/false) {}
  bool start_object(size_t size) {
    if (++depth_ > kMaxDepth) return refuse("nested deeper than " + std::to_string(kMaxDepth));
    if (size != size_t(-1) && size > kMaxMapEntries) {
      return refuse("a map of " + std::to_string(size) + " entries, over " +
                    std::to_string(kMaxMapEntries));
    }
    if (++maps_ > kMaxMaps) return refuse("more than " + std::to_string(kMaxMaps) + " maps");
    return count() && json_sax_dom_parser::start_object(size);
  }
  bool start_array(size_t size) {
    if (++depth_ > kMaxDepth) return refuse("nested deeper than " + std::to_string(kMaxDepth));
    if (size != size_t(-1) && size > kMaxListEntries) {
      return refuse("a list of " + std::to_string(size) + " entries, over " +
                    std::to_string(kMaxListEntries));
    }
    return count() && json_sax_dom_parser::start_array(size);
  }
  bool end_object() {
    --depth_;
    return json_sax_dom_parser::end_object();
  }
  bool end_array() {
    --depth_;
    return json_sax_dom_parser::end_array();
  }
  bool null() { return count() && json_sax_dom_parser::null(); }
  bool boolean(bool v) { return count() && json_sax_dom_parser::boolean(v); }
  bool number_integer(json::number_integer_t v) {
    return count() && json_sax_dom_parser::number_integer(v);
  }
  bool number_unsigned(json::number_unsigned_t v) {
    return count() && json_sax_dom_parser::number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const std::string& s) {
    return count() && json_sax_dom_parser::number_float(v, s);
  }
  bool string(json::string_t& v) { return count() && json_sax_dom_parser::string(v); }
  bool binary(json::binary_t& v) { return count() && json_sax_dom_parser::binary(v); }
  // Why the frame was refused; empty when its shape is within bounds.
  const std::string& refusal() const { return refusal_; }

 private:
  bool count() {
    if (++values_ <= kMaxValues) return true;
    return refuse("more than " + std::to_string(kMaxValues) + " values");
  }
  bool refuse(std::string why) {
    if (refusal_.empty()) refusal_ = std::move(why);
    return false;
  }
  size_t depth_ = 0, values_ = 0, maps_ = 0;
  std::string refusal_;
};

// Reads typed, bounded fields of one message; remembers the first problem.
class FieldReader {
 public:
  FieldReader(const json& object, std::string_view type) : object_(object), type_(type) {}

  const std::string& error() const { return error_; }
  // Whether an optional field is present.
  bool has(const char* key) const { return object_.contains(key); }

  int64_t integer(const char* key, int64_t min, int64_t max) {
    const json* value = field(key);
    if (value == nullptr) return 0;
    if (value->is_number_unsigned()) {
      uint64_t v = value->get<uint64_t>();
      if (v > uint64_t(max) || (min > 0 && v < uint64_t(min))) return fail(key, "out of range"), 0;
      return int64_t(v);
    }
    if (!value->is_number_integer()) return fail(key, "not an integer"), 0;
    int64_t v = value->get<int64_t>();
    if (v < min || v > max) return fail(key, "out of range"), 0;
    return v;
  }
  int32_t int32(const char* key, int32_t min = 0,
                int32_t max = std::numeric_limits<int32_t>::max()) {
    return int32_t(integer(key, min, max));
  }
  uint64_t uint64(const char* key) {
    const json* value = field(key);
    if (value == nullptr) return 0;
    if (!value->is_number_unsigned()) return fail(key, "not an unsigned integer"), 0;
    return value->get<uint64_t>();
  }
  float real(const char* key) {
    const json* value = field(key);
    if (value == nullptr) return 0;
    if (!value->is_number()) return fail(key, "not a number"), 0.0f;
    if (!is_finite_float(*value)) return fail(key, "not a finite number"), 0.0f;
    return value->get<float>();
  }
  bool boolean(const char* key) {
    const json* value = field(key);
    if (value == nullptr) return false;
    if (!value->is_boolean()) return fail(key, "not a boolean"), false;
    return value->get<bool>();
  }
  std::string string(const char* key, size_t max_bytes = kMaxStringBytes) {
    const json* value = field(key);
    if (value == nullptr) return {};
    if (!value->is_string()) return fail(key, "not a string"), std::string();
    const auto& s = value->get_ref<const std::string&>();
    if (s.size() > max_bytes)
      return fail(key, "longer than " + std::to_string(max_bytes) + " bytes"), std::string();
    return s;
  }
  std::vector<uint8_t> bytes(const char* key, size_t max_bytes) {
    const json* value = field(key);
    if (value == nullptr) return {};
    if (!value->is_binary()) return fail(key, "not binary"), std::vector<uint8_t>();
    const auto& b = value->get_binary();
    if (b.size() > max_bytes)
      return fail(key, "longer than " + std::to_string(max_bytes) + " bytes"),
             std::vector<uint8_t>();
    return std::vector<uint8_t>(b.begin(), b.end());
  }
  std::vector<int32_t> ints(const char* key, size_t max_count, int32_t min = 0,
                            int32_t max = std::numeric_limits<int32_t>::max()) {
    std::vector<int32_t> out;
    const json* value = field(key);
    if (value == nullptr) return out;
    if (!value->is_array()) return fail(key, "not a list"), out;
    if (value->size() > max_count)
      return fail(key, "more than " + std::to_string(max_count) + " entries"), out;
    out.reserve(value->size());
    for (const json& item : *value) {
      if (!item.is_number_integer()) return fail(key, "holds a non-integer"), out;
      int64_t v = item.get<int64_t>();
      if (v < min || v > max) return fail(key, "holds an out-of-range value"), out;
      out.push_back(int32_t(v));
    }
    return out;
  }
  std::vector<float> reals(const char* key, size_t max_count) {
    std::vector<float> out;
    const json* value = list(key, max_count);
    if (value == nullptr) return out;
    for (const json& item : *value) {
      if (!item.is_number() || !is_finite_float(item))
        return fail(key, "holds a non-finite number"), out;
      out.push_back(item.get<float>());
    }
    return out;
  }
  const json* list(const char* key, size_t max_count) {
    const json* value = field(key);
    if (value == nullptr) return nullptr;
    if (!value->is_array()) return fail(key, "not a list"), nullptr;
    if (value->size() > max_count) return fail(key, "too many entries"), nullptr;
    return value;
  }
  const json* object(const char* key) {
    const json* value = field(key);
    if (value == nullptr) return nullptr;
    if (!value->is_object()) return fail(key, "not a map"), nullptr;
    return value;
  }
  void fail(std::string_view key, std::string_view what) {
    if (error_.empty())
      error_ = std::string(type_) + "." + std::string(key) + ": " + std::string(what);
  }

 private:
  // Finite once narrowed to a float too (1e300 would become inf).
  static bool is_finite_float(const json& number) {
    const double v = number.get<double>();
    return std::isfinite(v) && std::fabs(v) <= kMaxRealMagnitude;
  }
  const json* field(const char* key) {
    auto it = object_.find(key);
    if (it == object_.end()) {
      fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }

  const json& object_;
  std::string_view type_;
  std::string error_;
};

json binary(const std::vector<uint8_t>& bytes) { return json::binary(bytes); }

// --- per-type field lists: one to_json and one from_json each -------------

json to_json(const SamplingSpec& s) {
  json out = {{"temperature", s.temperature},
              {"top_p", s.top_p},
              {"top_k", s.top_k},
              {"seed", s.seed},
              {"max_tokens", s.max_tokens},
              {"stop_token_ids", s.stop_token_ids},
              {"ignore_eos", s.ignore_eos},
              {"logprobs", s.logprobs}};
  if (s.min_p != 0.0f) out["min_p"] = s.min_p;
  if (s.presence_penalty != 0.0f) out["presence_penalty"] = s.presence_penalty;
  if (s.frequency_penalty != 0.0f) out["frequency_penalty"] = s.frequency_penalty;
  if (s.repetition_penalty != 1.0f) out["repetition_penalty"] = s.repetition_penalty;
  if (s.min_tokens != 0) out["min_tokens"] = s.min_tokens;
  if (s.prompt_logprobs >= 0) out["prompt_logprobs"] = s.prompt_logprobs;
  if (!s.logit_bias_ids.empty()) {
    out["bias_ids"] = s.logit_bias_ids;
    out["bias_values"] = s.logit_bias_values;
  }
  return out;
}
SamplingSpec sampling_from(FieldReader& parent, const char* key, std::string_view type) {
  SamplingSpec s;
  const json* object = parent.object(key);
  if (object == nullptr) return s;
  FieldReader r(*object, type);
  s.temperature = r.real("temperature");
  s.top_p = r.real("top_p");
  s.top_k = r.int32("top_k", -1);
  s.seed = r.uint64("seed");
  s.max_tokens = r.int32("max_tokens", 1);
  s.stop_token_ids = r.ints("stop_token_ids", kMaxStopTokenIds);
  s.ignore_eos = r.boolean("ignore_eos");
  s.logprobs = r.int32("logprobs", 0, kMaxTopLogprobs);
  if (object->contains("min_p")) s.min_p = r.real("min_p");
  if (object->contains("presence_penalty")) s.presence_penalty = r.real("presence_penalty");
  if (object->contains("frequency_penalty")) s.frequency_penalty = r.real("frequency_penalty");
  if (object->contains("repetition_penalty")) s.repetition_penalty = r.real("repetition_penalty");
  if (object->contains("min_tokens")) {
    s.min_tokens = r.int32("min_tokens", 0, std::numeric_limits<int32_t>::max());
  }
  if (object->contains("prompt_logprobs"))
    s.prompt_logprobs = r.int32("prompt_logprobs", 0, kMaxTopLogprobs);
  if (object->contains("bias_ids") || object->contains("bias_values")) {
    s.logit_bias_ids = r.ints("bias_ids", kMaxLogitBias);
    s.logit_bias_values = r.reals("bias_values", kMaxLogitBias);
  }
  if (r.error().empty() && s.logit_bias_ids.size() != s.logit_bias_values.size()) {
    r.fail("bias_ids", "and bias_values differ in length");
  }
  if (r.error().empty() && (s.min_p < 0.0f || s.min_p > 1.0f || s.repetition_penalty <= 0.0f)) {
    r.fail("min_p", "or repetition_penalty out of range");
  }
  if (!r.error().empty()) parent.fail(key, r.error());
  return s;
}

json to_json(const NodeLoad& l) {
  json out = json::object();
  for (const NodeLoadField& f : kNodeLoadFields) out[f.name] = l.*f.member;
  return out;
}
NodeLoad load_from(FieldReader& parent, const char* key) {
  NodeLoad l;
  const json* object = parent.object(key);
  if (object == nullptr) return l;
  FieldReader r(*object, "load");
  for (const NodeLoadField& f : kNodeLoadFields) {
    if (!object->contains(f.name)) continue;  // an older node's: 0
    // Bounded so that the router's sums over nodes and over a node's
    // heartbeats stay far from overflow: 2^50 tokens or bytes is beyond any.
    l.*f.member = r.integer(f.name, 0, kMaxLoadValue);
  }
  if (!r.error().empty()) parent.fail(key, r.error());
  return l;
}

// What a node computed goes out as the decoder takes it (reals finite and
// within kMaxRealMagnitude, strings within kMaxStringBytes): a frame it
// refuses is lost whole, and an events frame carries every request of a
// step. Non-finite log-probabilities (NaN logits the engine serves on)
// become the most negative bound, the largest ones their bound.
float wire_real(float v) {
  // The largest float within the bound (float(1e30) itself is above it).
  static const float bound = std::nextafter(float(kMaxRealMagnitude), 0.0f);
  if (std::isnan(v)) return -bound;
  return std::clamp(v, -bound, bound);
}

json wire_reals(const std::vector<float>& values) {
  json out = json::array();
  for (float v : values) out.push_back(wire_real(v));
  return out;
}

// At most kMaxStringBytes, cut before a UTF-8 sequence the limit would split.
std::string wire_string(const std::string& text) {
  if (text.size() <= kMaxStringBytes) return text;
  size_t end = kMaxStringBytes;
  while (end > 0 && (uint8_t(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

json to_json(const std::vector<TokenLogprobs>& list) {
  json out = json::array();
  for (const TokenLogprobs& t : list) {
    out.push_back(
        {{"lp", wire_real(t.logprob)}, {"ids", t.top_ids}, {"lps", wire_reals(t.top_logprobs)}});
  }
  return out;
}

std::vector<TokenLogprobs> logprobs_from(FieldReader& parent, const char* key, size_t max_count) {
  std::vector<TokenLogprobs> out;
  const json* list = parent.list(key, max_count);
  if (list == nullptr) return out;
  for (const json& item : *list) {
    if (!item.is_object()) {
      parent.fail(key, "holds a non-map");
      return out;
    }
    FieldReader r(item, key);
    TokenLogprobs t;
    t.logprob = r.real("lp");
    t.top_ids = r.ints("ids", size_t(kMaxTopLogprobs));
    t.top_logprobs = r.reals("lps", size_t(kMaxTopLogprobs));
    if (r.error().empty() && t.top_ids.size() != t.top_logprobs.size())
      r.fail("lps", "not paired with ids");
    if (!r.error().empty()) {
      parent.fail(key, r.error());
      return out;
    }
    out.push_back(std::move(t));
  }
  return out;
}

json to_json(const TokenEvent& e) {
  json out = {{"request_id", e.request_id},
              {"tokens", e.tokens},
              {"finish_reason", finish_reason_name(e.finish_reason)},
              {"error", wire_string(e.error)},
              {"logprobs", to_json(e.logprobs)},
              {"queue_s", wire_real(e.queue_seconds)},
              {"prefill_s", wire_real(e.prefill_seconds)}};
  if (!e.prompt_logprobs.empty()) out["prompt_logprobs"] = to_json(e.prompt_logprobs);
  if (e.cached_tokens >= 0) out["cached"] = e.cached_tokens;
  return out;
}

struct Codec {
  json operator()(const Register& m) const {
    json out = {{"t", "register"},
                {"node", m.node},
                {"role", role_name(m.role)},
                {"descriptor", binary(m.descriptor)},
                {"block_size", m.block_size},
                {"max_model_len", m.max_model_len},
                {"pid", m.pid},
                {"kv_dtype", m.kv_dtype},
                {"kv_bytes_per_token", m.kv_bytes_per_token},
                {"device", m.device},
                {"kv_staging", m.kv_staging},
                {"weights_bytes", m.weights_bytes},
                {"kv_pool_bytes", m.kv_pool_bytes}};
    if (!m.prefix_caching) out["prefix_caching"] = false;
    return out;
  }
  json operator()(const RegisterAck& m) const {
    json out = {{"t", "register_ack"}, {"accepted", m.accepted}, {"message", m.message}};
    if (m.registration != 0) out["registration"] = m.registration;
    return out;
  }
  json operator()(const Heartbeat& m) const {
    json out = {{"t", "heartbeat"}, {"node", m.node}, {"load", to_json(m.load)}};
    if (!m.kv_paths.empty()) out["kv_paths"] = m.kv_paths;
    if (m.registration != 0) out["registration"] = m.registration;
    return out;
  }
  json operator()(const PeerInfo& m) const {
    return {{"t", "peer_info"}, {"node", m.node}, {"descriptor", binary(m.descriptor)}};
  }
  json operator()(const Generate& m) const {
    return {{"t", "generate"},
            {"request_id", m.request_id},
            {"prompt", m.prompt},
            {"sampling", to_json(m.sampling)},
            {"prefill_node", m.prefill_node},
            {"client_id", m.client_id}};
  }
  json operator()(const PrefillReady& m) const {
    return {{"t", "prefill_ready"},
            {"request_id", m.request_id},
            {"transfer_id", m.transfer_id},
            {"dst_blocks", m.dst_blocks},
            {"cached_blocks", m.cached_blocks},
            {"skipped_blocks", m.skipped_blocks}};
  }
  json operator()(const Prefill& m) const {
    return {{"t", "prefill"},
            {"request_id", m.request_id},
            {"prompt", m.prompt},
            {"sampling", to_json(m.sampling)},
            {"decode_node", m.decode_node},
            {"transfer_id", m.transfer_id},
            {"dst_blocks", m.dst_blocks},
            {"cached_blocks", m.cached_blocks},
            {"skipped_blocks", m.skipped_blocks},
            {"client_id", m.client_id}};
  }
  json operator()(const PrefillDone& m) const {
    json out = {{"t", "prefill_done"},
                {"request_id", m.request_id},
                {"first_token", m.first_token},
                {"rng_draws", m.rng_draws},
                {"error", wire_string(m.error)},
                {"first_logprobs", to_json(m.first_logprobs)},
                {"queue_s", wire_real(m.queue_seconds)},
                {"prefill_s", wire_real(m.prefill_seconds)}};
    if (!m.prompt_logprobs.empty()) out["prompt_logprobs"] = to_json(m.prompt_logprobs);
    if (m.cached_tokens >= 0) out["cached"] = m.cached_tokens;
    return out;
  }
  json operator()(const Abort& m) const {
    return {{"t", "abort"}, {"request_id", m.request_id}, {"reason", wire_string(m.reason)}};
  }
  json operator()(const Events& m) const {
    json events = json::array();
    for (const TokenEvent& e : m.events) events.push_back(to_json(e));
    return {{"t", "events"}, {"events", std::move(events)}};
  }
  json operator()(const Rejected& m) const {
    return {
        {"t", "rejected"}, {"type", m.type}, {"request_id", m.request_id}, {"reason", m.reason}};
  }
};

Result<Message> decode_fields(const json& object, const std::string& type) {
  FieldReader r(object, type);
  auto finish = [&](Message message) -> Result<Message> {
    if (!r.error().empty()) return data_loss("control message " + r.error());
    return message;
  };
  if (type == "register") {
    Register m;
    m.node = r.string("node");
    const std::string role = r.string("role", 16);
    m.descriptor = r.bytes("descriptor", kMaxDescriptorBytes);
    m.block_size = r.int32("block_size", 1);
    m.max_model_len = r.int32("max_model_len", 1);
    m.pid = r.integer("pid", 0, std::numeric_limits<int64_t>::max());
    m.kv_dtype = r.string("kv_dtype", 16);
    m.kv_bytes_per_token = r.integer("kv_bytes_per_token", 0, int64_t(1) << 40);
    m.device = r.string("device", 16);
    m.kv_staging = r.string("kv_staging", 128);
    m.weights_bytes = r.integer("weights_bytes", 0, int64_t(1) << 50);
    m.kv_pool_bytes = r.integer("kv_pool_bytes", 0, int64_t(1) << 50);
    if (r.has("prefix_caching")) m.prefix_caching = r.boolean("prefix_caching");
    const std::optional<Role> parsed = parse_role(role);
    if (parsed == Role::kPrefill || parsed == Role::kDecode)
      m.role = *parsed;
    else if (r.error().empty())
      r.fail("role", "not prefill or decode");
    return finish(std::move(m));
  }
  if (type == "register_ack") {
    RegisterAck m;
    m.accepted = r.boolean("accepted");
    m.message = r.string("message");
    if (r.has("registration")) m.registration = r.uint64("registration");
    return finish(std::move(m));
  }
  if (type == "heartbeat") {
    Heartbeat m;
    m.node = r.string("node");
    m.load = load_from(r, "load");
    if (r.has("registration")) m.registration = r.uint64("registration");
    if (r.has("kv_paths")) {
      if (const json* paths = r.object("kv_paths"); paths != nullptr) {
        if (paths->size() > kMaxKvPaths) r.fail("kv_paths", "too many entries");
        for (const auto& [peer, path] : paths->items()) {
          if (!r.error().empty()) break;
          if (!path.is_string() || peer.size() > kMaxStringBytes ||
              path.get_ref<const std::string&>().size() > kMaxStringBytes) {
            r.fail("kv_paths", "holds an entry that is not a short string");
            break;
          }
          m.kv_paths.emplace(peer, path.get<std::string>());
        }
      }
    }
    return finish(std::move(m));
  }
  if (type == "peer_info") {
    PeerInfo m;
    m.node = r.string("node");
    m.descriptor = r.bytes("descriptor", kMaxDescriptorBytes);
    return finish(std::move(m));
  }
  if (type == "generate") {
    Generate m;
    m.request_id = r.uint64("request_id");
    m.prompt = r.ints("prompt", kMaxPromptTokens);
    m.sampling = sampling_from(r, "sampling", "generate.sampling");
    m.prefill_node = r.string("prefill_node");
    m.client_id = r.string("client_id", kMaxClientIdBytes);
    return finish(std::move(m));
  }
  if (type == "prefill_ready") {
    PrefillReady m;
    m.request_id = r.uint64("request_id");
    m.transfer_id = r.uint64("transfer_id");
    m.dst_blocks = r.ints("dst_blocks", kMaxBlocksPerRequest);
    m.cached_blocks = r.int32("cached_blocks", 0, int32_t(kMaxBlocksPerRequest));
    m.skipped_blocks = r.int32("skipped_blocks", 0, int32_t(kMaxBlocksPerRequest));
    return finish(std::move(m));
  }
  if (type == "prefill") {
    Prefill m;
    m.request_id = r.uint64("request_id");
    m.prompt = r.ints("prompt", kMaxPromptTokens);
    m.sampling = sampling_from(r, "sampling", "prefill.sampling");
    m.decode_node = r.string("decode_node");
    m.transfer_id = r.uint64("transfer_id");
    m.dst_blocks = r.ints("dst_blocks", kMaxBlocksPerRequest);
    m.cached_blocks = r.int32("cached_blocks", 0, int32_t(kMaxBlocksPerRequest));
    m.skipped_blocks = r.int32("skipped_blocks", 0, int32_t(kMaxBlocksPerRequest));
    m.client_id = r.string("client_id", kMaxClientIdBytes);
    return finish(std::move(m));
  }
  if (type == "prefill_done") {
    PrefillDone m;
    m.request_id = r.uint64("request_id");
    m.first_token = r.int32("first_token", -1);
    m.rng_draws = r.uint64("rng_draws");
    m.error = r.string("error");
    m.first_logprobs = logprobs_from(r, "first_logprobs", 1);
    if (r.has("prompt_logprobs"))
      m.prompt_logprobs = logprobs_from(r, "prompt_logprobs", kMaxPromptTokens);
    m.queue_seconds = r.real("queue_s");
    m.prefill_seconds = r.real("prefill_s");
    if (r.has("cached")) m.cached_tokens = r.int32("cached", 0, int32_t(kMaxPromptTokens));
    return finish(std::move(m));
  }
  if (type == "abort") {
    Abort m;
    m.request_id = r.uint64("request_id");
    m.reason = r.string("reason");
    return finish(std::move(m));
  }
  if (type == "events") {
    Events m;
    if (const json* list = r.list("events", kMaxEventsPerMessage)) {
      m.events.reserve(list->size());
      for (const json& item : *list) {
        if (!item.is_object()) {
          r.fail("events", "holds a non-map");
          break;
        }
        FieldReader e(item, "events[]");
        TokenEvent event;
        event.request_id = e.uint64("request_id");
        event.tokens = e.ints("tokens", kMaxPromptTokens);
        const std::string finish = e.string("finish_reason", 16);
        if (auto reason = parse_finish_reason(finish)) {
          event.finish_reason = *reason;
        } else if (e.error().empty()) {
          e.fail("finish_reason", "not a finish reason: '" + finish + "'");
        }
        event.error = e.string("error");
        event.logprobs = logprobs_from(e, "logprobs", kMaxPromptTokens);
        if (e.has("prompt_logprobs"))
          event.prompt_logprobs = logprobs_from(e, "prompt_logprobs", kMaxPromptTokens);
        event.queue_seconds = e.real("queue_s");
        event.prefill_seconds = e.real("prefill_s");
        if (e.has("cached")) event.cached_tokens = e.int32("cached", 0, int32_t(kMaxPromptTokens));
        if (!e.error().empty()) {
          r.fail("events", e.error());
          break;
        }
        m.events.push_back(std::move(event));
      }
    }
    return finish(std::move(m));
  }
  if (type == "rejected") {
    Rejected m;
    m.type = r.string("type", 64);
    m.request_id = r.uint64("request_id");
    m.reason = r.string("reason");
    return finish(std::move(m));
  }
  return data_loss("control message: unknown type '" + type.substr(0, 64) + "'");
}

}  // namespace

std::string_view message_type(const Message& message) {
  static constexpr std::string_view kNames[] = {
      "register", "register_ack", "heartbeat", "peer_info", "generate", "prefill_ready",
      "prefill",  "prefill_done", "abort",     "events",    "rejected"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[message.index()];
}

namespace {

// What one event adds to a frame, counted as the decoder counts (values:
// every scalar, list and map), and its bytes at most: msgpack writes a
// token id or a float (an event's reals are floats) in 5 bytes, a list's
// or map's header in up to 5, a log-probability's keys in 11.
struct FrameCost {
  size_t maps = 0, values = 0, bytes = 0;
};

FrameCost cost_of(const TokenEvent& e) {
  FrameCost c;
  c.maps = 1;
  c.values = 11 + e.tokens.size();  // the map, its scalars, its lists
  c.bytes = 128 + e.error.size();
  for (const auto* list : {&e.logprobs, &e.prompt_logprobs}) {
    for (const TokenLogprobs& t : *list) {
      c.maps += 1;
      c.values += 4 + t.top_ids.size() + t.top_logprobs.size();
    }
  }
  c.bytes += 5 * c.values + 11 * c.maps;
  return c;
}

}  // namespace

std::vector<Events> split_events(std::vector<TokenEvent> events) {
  std::vector<Events> frames;
  FrameCost used;
  for (TokenEvent& event : events) {
    const FrameCost c = cost_of(event);
    const bool fits = !frames.empty() && frames.back().events.size() < kMaxEventsPerMessage &&
                      used.maps + c.maps <= kMaxFrameMaps / 4 * 3 &&
                      used.values + c.values <= kMaxFrameValues / 4 * 3 &&
                      used.bytes + c.bytes <= kMaxMessageBytes / 4 * 3;
    if (!fits) {
      frames.emplace_back();
      used = {};
    }
    used.maps += c.maps;
    used.values += c.values;
    used.bytes += c.bytes;
    frames.back().events.push_back(std::move(event));
  }
  return frames;
}

std::vector<uint8_t> encode(const Message& message) {
  json object = std::visit(Codec{}, message);
  object["v"] = kProtocolVersion;
  return json::to_msgpack(object);
}

namespace {

// The frame as a bounded MessagePack map: kDataLoss when its size or shape is off.
Result<json> parse_map(std::span<const uint8_t> frame) {
  if (frame.empty()) return data_loss("control message: empty frame");
  if (frame.size() > kMaxMessageBytes) {
    return data_loss("control message: " + std::to_string(frame.size()) +
                     " bytes, over the limit of " + std::to_string(kMaxMessageBytes));
  }
  json object;
  BoundedSax sax(object);
  bool parsed =
      json::sax_parse(frame.begin(), frame.end(), &sax, nlohmann::detail::input_format_t::msgpack,
                      /*strict=*/true);
  if (!sax.refusal().empty()) return data_loss("control message: " + sax.refusal());
  if (!parsed || sax.is_errored()) return data_loss("control message: not valid MessagePack");
  if (!object.is_object()) return data_loss("control message: not a map");
  return object;
}

}  // namespace

Rejected rejection_of(std::span<const uint8_t> frame, const Status& refusal) {
  Rejected rejected;
  rejected.reason = refusal.message().substr(0, kMaxStringBytes);
  Result<json> object = parse_map(frame);
  if (!object.is_ok()) return rejected;
  if (auto t = object->find("t"); t != object->end() && t->is_string()) {
    rejected.type = t->get<std::string>().substr(0, 64);
  }
  if (auto id = object->find("request_id"); id != object->end() && id->is_number_unsigned()) {
    rejected.request_id = id->get<uint64_t>();
  }
  return rejected;
}

Result<Message> decode(std::span<const uint8_t> frame) {
  Result<json> parsed = parse_map(frame);
  if (!parsed.is_ok()) return parsed.status();
  const json& object = *parsed;
  FieldReader envelope(object, "message");
  int64_t version = envelope.integer("v", 0, std::numeric_limits<int32_t>::max());
  std::string type = envelope.string("t", 64);
  if (!envelope.error().empty()) return data_loss("control " + envelope.error());
  if (version != kProtocolVersion) {
    return data_loss("control message '" + type + "': protocol version " + std::to_string(version) +
                     ", this build speaks " + std::to_string(kProtocolVersion));
  }
  return decode_fields(object, type);
}

}  // namespace baton::control
