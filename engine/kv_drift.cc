#include "engine/kv_drift.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/block_manager.h"

namespace baton::engine {
namespace {

// log_softmax of one row of logits, in double.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - max);
  const double log_sum = max + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - log_sum;
  return out;
}

size_t argmax(const std::vector<double>& v) {
  return size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

void KvDrift::add(const KvDrift& other) {
  positions += other.positions;
  sum_abs += other.sum_abs;
  max_abs = std::max(max_abs, other.max_abs);
  changed += other.changed;
  far += other.far;
}

Result<std::vector<KvDrift>> measure_kv_drift(Engine& reference,
                                              std::span<Engine* const> candidates,
                                              std::span<const int32_t> tokens, int32_t first_step) {
  const int32_t block_size = reference.kv_pool().layout().block_size;
  const auto n = int32_t(tokens.size());
  first_step = std::clamp(first_step, 1, std::max(n, 1));
  // Each engine's pool, addressed by a table of its own: the reference's
  // first.
  std::vector<Engine*> engines{&reference};
  engines.insert(engines.end(), candidates.begin(), candidates.end());
  std::vector<BlockManager> managers;
  std::vector<BlockTable> tables;
  managers.reserve(engines.size());
  tables.reserve(engines.size());
  for (Engine* e : engines) {
    if (e->model_config().vocab_size != reference.model_config().vocab_size)
      return invalid_argument("the engines' models have different vocabularies");
    const KvLayout& layout = e->kv_pool().layout();
    if (layout.block_size != block_size)
      return invalid_argument("the engines' KV pools have different block sizes");
    if (int64_t(layout.num_blocks) * block_size < n)
      return invalid_argument("a KV pool of " + std::to_string(layout.num_blocks) +
                              " blocks cannot hold " + std::to_string(n) + " tokens");
    managers.emplace_back(layout.num_blocks);
    tables.emplace_back(block_size);
  }
  std::vector<KvDrift> drift(candidates.size());
  std::vector<float> logits;
  std::vector<double> want;
  for (int32_t pos = 0; pos < n;) {
    const int32_t step = pos == 0 ? first_step : 1;
    const std::span<const int32_t> run = tokens.subspan(size_t(pos), size_t(step));
    size_t greedy = 0;
    for (size_t e = 0; e < engines.size(); ++e) {
      BATON_RETURN_IF_ERROR(tables[e].reserve(managers[e], step));
      StepPlan plan{{{run, pos, &tables[e], true}}};
      BATON_RETURN_IF_ERROR(engines[e]->model().forward(plan, engines[e]->kv_pool(), &logits));
      tables[e].commit(step);
      const std::vector<double> got = log_softmax(logits);
      if (e == 0) {
        want = got;
        greedy = argmax(want);
        continue;
      }
      const double delta = std::fabs(got[greedy] - want[greedy]);
      if (!std::isfinite(delta))
        return invalid_argument("position " + std::to_string(pos + step - 1) +
                                ": a log-prob is not finite");
      KvDrift& d = drift[e - 1];
      d.sum_abs += delta;
      d.max_abs = std::max(d.max_abs, delta);
      d.changed += argmax(got) != greedy;
      d.far += delta > kFarDlogprob;
      ++d.positions;
    }
    pos += step;
  }
  for (size_t e = 0; e < engines.size(); ++e) tables[e].release(managers[e]);
  return drift;
}

}  // namespace baton::engine
