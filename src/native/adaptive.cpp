#include "adaptive.h"

#include <algorithm>
#include <cmath>

namespace llamaspec {

namespace {
constexpr double kDecay = 0.93;       // evidence fades over the last ~14 verifies (a change of text is noticed fast)
constexpr double kAlpha = 0.2;        // cost EMAs; symmetric (following faster times faster biased the
                                      // estimates toward the length measured most: it looked cheapest)
constexpr double kPriorAccepted = 0.5;  // acceptance prior: half of one (0.5) until evidence arrives
constexpr double kPriorTried = 1;
constexpr double kExtraTokenCost = 0.25;  // cost slope guess (per extra draft token, relative) before two lengths are known
constexpr uint32_t kProbeGapMin = 8, kProbeGapMax = 32;
constexpr uint64_t kProbeEvery = 8;   // while drafting: try one position more, then one less, this often
}  // namespace

void DraftLengthPolicy::CostTable::observe(size_t i, double us) {
    if (i >= ema.size()) return;
    ema[i] = weight[i] > 0 ? (1 - kAlpha) * ema[i] + kAlpha * us : us;
    weight[i] += 1;
}

std::vector<double> DraftLengthPolicy::CostTable::filled() const {
    const size_t n = ema.size();
    std::vector<size_t> known;
    for (size_t i = 0; i < n; ++i) {
        if (weight[i] > 0) known.push_back(i);
    }
    std::vector<double> out(n, 1.0);
    if (known.empty()) return out;  // no evidence yet: flat (the calibration verifies come first)
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
    : n_max_(std::max(1, n_max)), n_min_(std::max(1, n_min)),
      asked_(n_max_, 0.0), drafted_(n_max_, 0.0), tried_(n_max_, 0.0), accepted_(n_max_, 0.0) {
    iteration_us_.ema.assign(n_max_ + 1, 0.0);
    iteration_us_.weight.assign(n_max_ + 1, 0.0);
    // calibration, twice: the longest draft, half of it, the shortest, none (verify costs are not
    // linear in the batch size, e.g. on hybrid models; the rest is interpolated and refined by probes)
    std::vector<int32_t> once;
    for (int32_t k : {n_max_, std::max(n_min_, n_max_ / 2), n_min_, 0}) {
        if (std::find(once.begin(), once.end(), k) == once.end()) once.push_back(k);
    }
    calibration_ = once;
    calibration_.insert(calibration_.end(), once.begin(), once.end());
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

double DraftLengthPolicy::expected_tokens(int32_t k) const {
    return expected_tokens_by_length()[std::clamp(k, 0, n_max_)];
}

double DraftLengthPolicy::expected_us(int32_t k) const {
    return iteration_us_.filled()[std::clamp(k, 0, n_max_)];
}

int32_t DraftLengthPolicy::best() const {
    // costs are measured per length asked for, as a whole (draft, verify, bookkeeping, sampling,
    // emission): cost curves are bumpy (one batch size can be slower than both neighbours), so a
    // length's own measurement beats any model of it; unmeasured lengths are interpolated
    const std::vector<double> tokens = expected_tokens_by_length();
    const std::vector<double> us = iteration_us_.filled();
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

int32_t DraftLengthPolicy::choose() {
    const uint64_t it = iteration_++;
    probing_ = -1;
    if (it < calibration_.size()) return calibration_[it];  // measure the cost curve at a few lengths first
    const int32_t k = best();
    if (k == 0) {
        if (it >= next_probe_) {  // drafting did not pay: look again now and then
            next_probe_ = it + probe_gap_;
            probing_ = n_min_;
            return n_min_;
        }
        return 0;
    }
    if (it % kProbeEvery == kProbeEvery - 1) {  // learn the neighbours: one position more, one less
        const bool longer = (it / kProbeEvery) % 2 == 0;
        if (longer && k < n_max_) return probing_ = k + 1;
        if (!longer) return probing_ = (k - 1 >= n_min_ ? k - 1 : 0);
    }
    return k;
}

void DraftLengthPolicy::observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us,
                                double rest_us) {
    n_requested = std::clamp(n_requested, 0, n_max_);
    n_drafted = std::clamp(n_drafted, 0, n_requested);
    n_accepted = std::clamp(n_accepted, 0, n_drafted);
    // all evidence fades with every draft, also at positions this one did not reach: a position
    // that is no longer observed drifts back to its prior instead of keeping a stale estimate. Plain
    // steps observe nothing and fade nothing (the probes look again).
    // A probe from plain decoding that is accepted in full is a surprise: the text has changed, so
    // half of the old evidence goes at once.
    const bool plain_probe = iteration_ > calibration_.size() && probing_ >= 0 && probing_ == n_min_;
    const double fade = plain_probe && n_accepted == n_requested && n_requested > 0 ? 0.5 : kDecay;
    if (n_requested > 0) {
        for (auto * v : {&asked_, &drafted_, &tried_, &accepted_}) {
            for (double & x : *v) x *= fade;
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
    // the first calibration pass warms up each length's graphs (first decodes at a new batch size
    // allocate): its times are not the machine's steady state, so only the second pass is measured
    if (iteration_ > calibration_.size() / 2) iteration_us_.observe((size_t) n_requested, draft_us + rest_us);
    if (plain_probe) {
        // a probe from plain decoding: back off while drafting still does not pay (also when the
        // probe was accepted: on a model where a longer verify costs as much, acceptance alone is not
        // enough), look often again once it does
        probe_gap_ = best() == 0 ? std::min(kProbeGapMax, probe_gap_ * 2) : kProbeGapMin;
    }
}

}  // namespace llamaspec
