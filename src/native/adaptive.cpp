#include "adaptive.h"

#include <algorithm>
#include <cmath>

namespace llamaspec {

namespace {
constexpr double kDecay = 0.97;       // acceptance evidence fades over the last ~33 drafting verifies
                                      // (0.93 made the estimate of long drafts noisy enough to flip the choice)
constexpr double kAlpha = 0.05;       // cost EMAs once a length is well measured (a running mean before);
                                      // symmetric (following faster times faster biased the estimates toward
                                      // the length measured most: it looked cheapest)
constexpr double kCostClip = 1.25;    // one measurement moves a known cost by at most x/÷ this (a preempted
                                      // verify, 1.5-2x, once locked a good length out for the rest of a call)
constexpr double kConfidenceFade = 0.98;  // a length's cost confidence fades with every verify measured
constexpr double kPriorAccepted = 0.5;  // acceptance prior: half of one (0.5) until evidence arrives
constexpr double kPriorTried = 1;
constexpr double kReplayPrior = 4;    // positions: the replay's shape outweighs the model's once it saw a verify or two
constexpr double kExtraTokenCost = 0.25;  // cost slope guess (per extra draft token, relative) before two lengths are known
constexpr uint64_t kProbeEvery = 32;   // a slot to learn another length this often (every 16th: ~5% slower
                                       // than fixed 5 at ~75% with 93% of verifies on 5; ADR 0009)
constexpr double kStaleness = 0.1;    // exploration's optimism: a cost measured rarely or long ago may be up to
constexpr double kOptimismMax = 0.5;  // this over sqrt(its confidence) lower than its estimate, at most this
constexpr uint32_t kFirstShadows = 3; // shadow drafts before the first decision (with the prior: 2 misses say "plain")
constexpr double kShadowBudget = 0.03;  // shadow drafts may cost up to 3% of plain decoding...
constexpr uint32_t kShadowGapMax = 32;  // ...but come at least this often
}  // namespace

void DraftLengthPolicy::CostTable::observe(size_t i, double us) {
    if (i >= ema.size()) return;
    if (weight[i] >= 2) us = std::clamp(us, ema[i] / kCostClip, ema[i] * kCostClip);
    // a running mean while few measurements back the estimate (also when they are old), then an EMA
    const double gain = std::max(kAlpha, 1.0 / (1.0 + confidence[i]));
    ema[i] = weight[i] > 0 ? (1 - gain) * ema[i] + gain * us : us;
    weight[i] += 1;
    for (double & c : confidence) c *= kConfidenceFade;
    confidence[i] += 1;
}

std::vector<double> DraftLengthPolicy::CostTable::filled() const {
    const size_t n = ema.size();
    std::vector<size_t> known;
    for (size_t i = 0; i < n; ++i) {
        if (weight[i] > 0) known.push_back(i);
    }
    std::vector<double> out(n, 1.0);
    if (known.empty()) return out;  // no evidence yet: flat (plain steps are measured first)
    auto slope_between = [&](size_t a, size_t b) {
        return std::max(0.0, (ema[b] - ema[a]) / (double) (b - a));
    };
    // one point: a guessed slope relative to it; more: the nearest two known points' slope
    const double slope_lo = known.size() >= 2 ? slope_between(known[0], known[1])
                                              : kExtraTokenCost * ema[known[0]] / (1 + kExtraTokenCost * (double) known[0]);
    const double slope_hi = known.size() >= 2 ? slope_between(known[known.size() - 2], known.back()) : slope_lo;
    for (size_t i = 0; i < n; ++i) {
        if (i <= known.front()) {
            out[i] = std::max(0.0, ema[known.front()] - slope_lo * (double) (known.front() - i));
        } else if (i >= known.back()) {
            out[i] = ema[known.back()] + slope_hi * (double) (i - known.back());
        } else {
            const auto it = std::lower_bound(known.begin(), known.end(), i);  // known.front() < i < known.back()
            const size_t hi = *it, lo = hi == i ? hi : *(it - 1);
            out[i] = lo == hi ? ema[lo] : ema[lo] + (ema[hi] - ema[lo]) * (double) (i - lo) / (double) (hi - lo);
        }
    }
    return out;
}

DraftLengthPolicy::DraftLengthPolicy(int32_t n_max, int32_t n_min)
    : n_max_(std::max(1, n_max)), n_min_(std::clamp(n_min, 1, std::max(1, n_max))),
      asked_(n_max_, 0.0), drafted_(n_max_, 0.0), tried_(n_max_, 0.0), accepted_(n_max_, 0.0) {
    iteration_us_.ema.assign(n_max_ + 1, 0.0);
    iteration_us_.weight.assign(n_max_ + 1, 0.0);
    iteration_us_.confidence.assign(n_max_ + 1, 0.0);
    warmed_.assign(n_max_ + 1, false);
    replay_.ends.assign(n_max_ + 1, 0.0);
    for (int32_t k = 0; k <= n_max_; ++k) replay_.state.emplace_back(k + 1, 0.0);
    replay_.clear();
}

double DraftLengthPolicy::p_drafted(int32_t i) const {
    return (drafted_[i] + 1.0) / (asked_[i] + 1.0);  // prior: the drafter delivers what is asked
}

std::vector<double> DraftLengthPolicy::expected_tokens_by_length() const {
    std::vector<double> e(n_max_ + 1, 1.0);
    double chain = 1.0;
    // position 0 shrinks toward 0.5; every later one toward the position before it (acceptance
    // tends to hold along a draft), so sparse evidence at long positions does not drag them to 0.5
    double p_acc = kPriorAccepted / kPriorTried;
    for (int32_t i = 0; i < n_max_; ++i) {
        p_acc = (accepted_[i] + p_acc * kPriorTried) / (tried_[i] + kPriorTried);
        chain *= p_drafted(i) * p_acc;
        e[i + 1] = e[i] + chain;
    }
    return e;
}

void DraftLengthPolicy::Replay::fade() {
    for (double & e : ends) e *= kDecay;
    positions *= kDecay;
    known *= kDecay;
    accepted *= kDecay;
}

void DraftLengthPolicy::Replay::clear() {
    for (auto & p : state) {
        std::fill(p.begin(), p.end(), 0.0);
        p[0] = 1.0;
    }
    std::fill(ends.begin(), ends.end(), 0.0);
    positions = known = accepted = 0;
}

void DraftLengthPolicy::Replay::add(int acc) {
    // a position never drafted (a verify's bonus token) is accepted with the observed rate
    const double a = acc < 0 ? (accepted + kPriorAccepted) / (known + kPriorTried) : (double) acc;
    for (size_t k = 1; k < state.size(); ++k) {
        std::vector<double> & p = state[k];
        double end = p[k];  // the position after k accepted drafts is the verify's own token
        for (size_t j = k; j > 0; --j) {
            end += p[j - 1] * (1 - a);  // a rejected draft: the verify ends with the target's token
            p[j] = p[j - 1] * a;
        }
        p[0] = end;
        ends[k] += end;
    }
    positions += 1;
    if (acc >= 0) {
        known += 1;
        accepted += acc;
    }
}

std::vector<double> DraftLengthPolicy::estimated_tokens_by_length() const {
    std::vector<double> e = expected_tokens_by_length();
    const int32_t r = last_requested_;
    if (r == 0 || replay_.ends[r] <= 1e-9) return e;  // plain: shadow drafts see position 0 only
    // the level from the per-position model at the length being drafted (it follows a change of text
    // within a few verifies), the shape across lengths from the replay (shrunk toward the model's
    // own shape while the replay has seen few positions)
    const double n = replay_.positions;
    const double w = n / (n + kReplayPrior);
    const double level = e[r];
    const double replay_r = n / replay_.ends[r];
    std::vector<double> out(e.size(), 1.0);
    for (int32_t k = 1; k <= n_max_; ++k) {
        const double replay_k = replay_.ends[k] > 1e-9 ? n / replay_.ends[k] : (double) (k + 1);
        out[k] = level * (w * replay_k / replay_r + (1 - w) * e[k] / e[r]);
    }
    return out;
}

double DraftLengthPolicy::expected_tokens(int32_t k) const {
    return estimated_tokens_by_length()[std::clamp(k, 0, n_max_)];
}

double DraftLengthPolicy::expected_us(int32_t k) const {
    return iteration_us_.filled()[std::clamp(k, 0, n_max_)];
}

int32_t DraftLengthPolicy::best(const std::vector<double> & tokens, const std::vector<double> & us) const {
    // costs are measured per length asked for, as a whole (draft, verify, bookkeeping, sampling,
    // emission): cost curves are bumpy (one batch size can be slower than both neighbours), so a
    // length's own measurement beats any model of it; unmeasured lengths are interpolated
    int32_t best_k = 0;
    double best_rate = tokens[0] / std::max(1e-9, us[0]);
    for (int32_t k = n_min_; k <= n_max_; ++k) {
        const double rate = tokens[k] / std::max(1e-9, us[k]);
        if (rate > best_rate * 1.0001) {  // ties go to the shorter draft
            best_rate = rate;
            best_k = k;
        }
    }
    return best_k;
}

uint32_t DraftLengthPolicy::shadow_gap() const {
    const double plain_us = iteration_us_.weight[0] > 0 ? iteration_us_.ema[0] : 0.0;
    if (shadow_us_ <= 0 || plain_us <= 0) return 1;
    const double gap = std::ceil(shadow_us_ / (kShadowBudget * plain_us));
    return (uint32_t) std::clamp(gap, 1.0, (double) kShadowGapMax);
}

int32_t DraftLengthPolicy::choose() {
    const uint64_t it = iteration_++;
    shadow_ = false;
    if (!calibration_.empty()) {  // measure the cost curve at a few lengths
        const int32_t k = calibration_.front();
        calibration_.erase(calibration_.begin());
        return k;
    }
    // start plain, looking with shadow drafts: nothing is verified until acceptance makes it worth it
    if (shadows_ < kFirstShadows || iteration_us_.weight[0] == 0) {
        shadow_ = true;
        return 0;
    }
    // an exploration slot that picks a length never verified spends that verify on its warm-up (not
    // measured): it is verified once more right after, so that one slot measures it
    auto probe = [this](int32_t c) {
        if (c > 0 && !warmed_[(size_t) c]) calibration_.push_back(c);
        return c;
    };
    // the tables best() and explore() read, once per step
    const std::vector<double> tokens = estimated_tokens_by_length();
    const std::vector<double> us = iteration_us_.filled();
    const int32_t k = best(tokens, us);  // with only the plain cost measured, longer verifies get a guessed slope
    if (k > 0 && !calibrated_) {
        // drafting may pay: measure what verifies really cost, at the longest draft, half of it and
        // the shortest, twice (the first of each allocates graphs and is not measured; verify costs
        // are not linear in the batch size, e.g. on hybrid models; the rest is interpolated and
        // refined by the probes below)
        calibrated_ = true;
        std::vector<int32_t> once;
        for (int32_t c : {n_max_, std::max(n_min_, n_max_ / 2), n_min_}) {
            if (std::find(once.begin(), once.end(), c) == once.end()) once.push_back(c);
        }
        calibration_ = once;
        calibration_.insert(calibration_.end(), once.begin(), once.end());
        const int32_t first = calibration_.front();
        calibration_.erase(calibration_.begin());
        return first;
    }
    if (k == 0) {  // drafting does not pay: keep looking, with shadow drafts...
        if (calibrated_ && it % kProbeEvery == kProbeEvery - 1) {
            // ...and doubt the costs that say so: measured during a slow spell, they would keep the
            // session plain at any acceptance (shadow drafts only update the acceptance)
            const int32_t c = explore(0, tokens, us);
            if (c != 0) return probe(c);
        }
        if (it >= next_shadow_) {
            shadow_ = true;
            next_shadow_ = it + shadow_gap();
        }
        return 0;
    }
    if (it % kProbeEvery == kProbeEvery - 1) return probe(explore(k, tokens, us));
    return k;
}

int32_t DraftLengthPolicy::explore(int32_t k, const std::vector<double> & tokens, const std::vector<double> & us) const {
    // the length with the best optimistic rate: its cost may be lower than estimated by an amount that
    // grows as its confidence fades (measured rarely, or long ago while the machine was slower), so
    // every plausible length is measured again from time to time, the most promising first; k itself
    // when no other could beat it (no exploration then). Cost curves are bumpy: interpolation can hide
    // a cheap length, and ±1 steps around k (the first version) never reached it.
    int32_t pick = k;
    double pick_rate = tokens[k] / std::max(1e-9, us[k]);
    for (int32_t c = n_min_; c <= n_max_; ++c) {
        if (c == k) continue;
        const double optimism =
            std::min(kOptimismMax, kStaleness / std::sqrt(std::max(1e-6, iteration_us_.confidence[c])));
        const double rate = tokens[c] / std::max(1e-9, us[c] * (1 - optimism));
        if (rate > pick_rate) {
            pick_rate = rate;
            pick = c;
        }
    }
    return pick;
}

void DraftLengthPolicy::observe_shadow(bool drafted, bool accepted, double draft_us) {
    // the same evidence as a one-position draft that was verified, without the verify
    for (auto * v : {&asked_, &drafted_, &tried_, &accepted_}) {
        for (double & x : *v) x *= kDecay;
    }
    asked_[0] += 1.0;
    if (drafted) {
        drafted_[0] += 1.0;
        tried_[0] += 1.0;
        accepted_[0] += accepted ? 1.0 : 0.0;
    }
    shadow_us_ = shadows_ > 0 ? (1 - kAlpha) * shadow_us_ + kAlpha * draft_us : draft_us;
    ++shadows_;
}

void DraftLengthPolicy::observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us,
                                double rest_us) {
    n_requested = std::clamp(n_requested, 0, n_max_);
    n_drafted = std::clamp(n_drafted, 0, n_requested);
    n_accepted = std::clamp(n_accepted, 0, n_drafted);
    // all evidence fades with every draft, also at positions this one did not reach: a position
    // that is no longer observed drifts back to its prior instead of keeping a stale estimate. Plain
    // steps observe nothing and fade nothing (their shadow drafts, reported apart, do).
    if (n_requested > 0) {
        for (auto * v : {&asked_, &drafted_, &tried_, &accepted_}) {
            for (double & x : *v) x *= kDecay;
        }
    }
    for (int32_t i = 0; i < n_requested && i <= n_drafted; ++i) {  // asked, and the one before was drafted
        asked_[i] += 1.0;
        drafted_[i] += i < n_drafted ? 1.0 : 0.0;
    }
    for (int32_t i = 0; i < n_drafted && i <= n_accepted; ++i) {  // drafted, and all before accepted
        tried_[i] += 1.0;
        accepted_[i] += i < n_accepted ? 1.0 : 0.0;
    }
    if (n_requested > 0) {
        // the replay describes the text drafted since the last plain step: what came before a plain
        // spell is another text (plain steps are not drafted, so they cannot be replayed)
        if (last_requested_ == 0) replay_.clear();
        replay_.fade();
        for (int32_t i = 0; i < n_accepted; ++i) replay_.add(1);
        replay_.add(n_accepted < n_requested ? 0 : -1);  // rejected or not produced; else the bonus token
    }
    last_requested_ = n_requested;
    // the first verify of each length warms up its graphs (first decodes at a new batch size
    // allocate): not the machine's steady state, so it is not measured
    if (!warmed_[(size_t) n_requested]) {
        warmed_[(size_t) n_requested] = true;
        return;
    }
    iteration_us_.observe((size_t) n_requested, draft_us + rest_us);
}

}  // namespace llamaspec
