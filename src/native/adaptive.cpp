#include "adaptive.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace llamaspec {

// The six constants of the policy; ADR 0009 gives the experiment behind each.
namespace {
constexpr double kDecay = 0.97;          // acceptance evidence fades by this per drafting observation
                                         // (a window of ~33 verifies)
constexpr size_t kCostWindow = 8;        // T(k): the mean of a length's last 8 measurements, less the largest
constexpr double kSlopeGuess = 0.25;     // an unmeasured verify's extra rows: +25% of a plain step each
                                         // (replaced by the first measurement)
constexpr double kShadowBudget = 0.01;   // watching (shadow drafts) costs at most 1% of plain decoding...
constexpr uint64_t kLookMax = 32;        // ...but come at least every 32 plain steps while drafting could
                                         // pay; also every 32nd verify measures a neighbour length
constexpr uint64_t kForget = 512;        // a drafting length's cost not measured for 512 steps is
                                         // estimated again (measured during a slow spell, it would
                                         // keep a good length out for good)
}  // namespace

void DraftLengthPolicy::Cost::add(double us, uint64_t iteration) {
    if (iteration - at > kForget) recent.clear();  // forgotten: old measurements do not come back
    at = iteration;
    if (!warmed) {  // a length's first decode allocates its graphs: not the steady state
        warmed = true;
        return;
    }
    if (recent.size() < kCostWindow) {
        recent.push_back(us);
    } else {
        recent[next] = us;
        next = (next + 1) % kCostWindow;
    }
}

double DraftLengthPolicy::Cost::mean() const {
    if (recent.empty()) return 0;
    const double sum = std::accumulate(recent.begin(), recent.end(), 0.0);
    if (recent.size() < 3) return sum / (double) recent.size();
    return (sum - *std::max_element(recent.begin(), recent.end())) / (double) (recent.size() - 1);
}

DraftLengthPolicy::DraftLengthPolicy(int32_t n_max, int32_t n_min)
    : n_max_(std::max(1, n_max)), n_min_(std::clamp(n_min, 1, std::max(1, n_max))),
      tried_(n_max_, 0.0), accepted_(n_max_, 0.0), cost_(n_max_ + 1) {}

bool DraftLengthPolicy::known(int32_t k) const {
    const Cost & c = cost_[(size_t) k];
    return !c.recent.empty() && (k == 0 || iteration_ - c.at <= kForget);
}

std::vector<double> DraftLengthPolicy::tokens() const {
    // E(k) = 1 + sum_{j=1..k} prod_{i<j} q_i, where q_i is the chance that draft position i is
    // accepted when asked for and every position before it was (a position the drafter did not
    // produce counts as rejected). Each q_i has one pseudo-observation of prior: 0.5 for position 0,
    // the estimate of the position before for the others (acceptance tends to hold along a draft,
    // so positions rarely reached are not dragged to 0.5).
    std::vector<double> e(n_max_ + 1, 1.0);
    double chain = 1.0, prior = 0.5;
    for (int32_t i = 0; i < n_max_; ++i) {
        const double q = (accepted_[i] + prior) / (tried_[i] + 1.0);
        chain *= q;
        e[i + 1] = e[i] + chain;
        prior = q;
    }
    return e;
}

std::vector<double> DraftLengthPolicy::costs() const {
    // A length's own measurements where they are recent (cost curves are bumpy: on the MTP fixture a
    // batch of 8 is slower than 7 and 9); elsewhere linear between the nearest measured lengths; past
    // the longest measured one (a plain step at least), a guess per extra token: the cheapest draft
    // time per token seen plus kSlopeGuess of a plain step for its verified row. (Not the slope of
    // the last two measured: cost curves are concave, on the hybrid MTP fixture a 1-token draft
    // costs 3x a plain step and an 8-token one 3.4x, so that slope rules out every longer draft.)
    std::vector<double> t(n_max_ + 1, 0.0);
    if (!known(0)) return t;
    std::vector<int32_t> measured;
    for (int32_t k = 0; k <= n_max_; ++k) {
        if (known(k)) {
            measured.push_back(k);
            t[k] = cost_[(size_t) k].mean();
        }
    }
    const double t0 = t[0], draft = std::max(0.0, draft_token_us_);
    for (int32_t k = 1; k <= n_max_; ++k) {
        if (known(k)) continue;
        const auto hi = std::upper_bound(measured.begin(), measured.end(), k);
        const int32_t lo = *(hi - 1);  // measured[0] == 0 < k
        t[k] = hi != measured.end() ? t[lo] + (t[*hi] - t[lo]) * (double) (k - lo) / (double) (*hi - lo)
                                    : t[lo] + (kSlopeGuess * t0 + draft) * (double) (k - lo);
    }
    return t;
}

int32_t DraftLengthPolicy::best(const std::vector<double> & e, const std::vector<double> & t) const {
    int32_t best_k = 0;
    double best_rate = e[0] / t[0];
    for (int32_t k = n_min_; k <= n_max_; ++k) {
        const double rate = e[k] / t[k];
        if (rate > best_rate) {  // ties go to the shorter draft
            best_rate = rate;
            best_k = k;
        }
    }
    return best_k;
}

int32_t DraftLengthPolicy::choose() {
    const uint64_t it = iteration_++;
    shadow_ = false;
    if (!known(0) || shadows_ < 2) {
        // the first steps are plain, each with a shadow draft, until a plain step and a shadow draft
        // were measured (past the warm-up of each: the first shadow draft also catches the drafter
        // up on the prompt)
        shadow_ = true;
        return 0;
    }
    const std::vector<double> t = costs();
    const int32_t k = best(tokens(), t);
    if (k > 0) {
        // every kLookMax-th verify measures a neighbour of the best length instead, k + 1 and k - 1
        // in turn: between measured lengths costs are interpolated, and a bumpy cost curve (or a
        // slow spell of one length) can hide a cheaper length there
        if (++verifies_ % kLookMax != 0) return k;
        const int32_t step = (verifies_ / kLookMax) % 2 == 0 ? 1 : -1;
        const int32_t n = k + step >= n_min_ && k + step <= n_max_ ? k + step : k - step;
        return n >= n_min_ && n <= n_max_ ? n : k;
    }
    // Plain. Acceptance can only be learnt from shadow drafts now; they matter only if some length
    // would pay were every draft accepted. A draft model as slow as its target never would: then no
    // shadow draft is made, and the draft model is not even kept up to date with the text.
    std::vector<double> full(n_max_ + 1);
    std::iota(full.begin(), full.end(), 1.0);
    if (best(full, t) == 0) return 0;
    if (it < next_shadow_) return 0;
    // A shadow draft after G plain steps costs about d + c * G: d, the draft itself (the cheapest
    // draft time per token seen), and c per row the drafter must catch up on (an MTP head's or a draft
    // model's decode of the text since the last draft). Watching costs (d + c * G) / G per plain step;
    // the gap is the shortest that keeps it within kShadowBudget of a plain step, and no gap can when
    // c alone exceeds it: then the drafter is left idle (a draft model nearly as slow as its target).
    const double budget = kShadowBudget * t[0];
    const double row = catch_up_row_.recent.empty() ? 0.0 : catch_up_row_.mean();
    if (row >= budget) return 0;
    shadow_ = true;
    const double gap = std::ceil(std::max(0.0, draft_token_us_) / (budget - row));
    next_shadow_ = it + (uint64_t) std::clamp(gap, 1.0, (double) kLookMax);
    return 0;
}

void DraftLengthPolicy::fade() {
    for (double & x : tried_) x *= kDecay;
    for (double & x : accepted_) x *= kDecay;
}

void DraftLengthPolicy::note_draft_time(double per_token_us) {
    draft_token_us_ = draft_token_us_ < 0 ? per_token_us : std::min(draft_token_us_, per_token_us);
}

void DraftLengthPolicy::observe_shadow(bool drafted, bool accepted, double draft_us) {
    // the evidence of a one-position draft that was verified, without the verify
    fade();
    tried_[0] += 1.0;
    accepted_[0] += drafted && accepted ? 1.0 : 0.0;
    if (drafted && shadows_ > 0) {  // the first one also caught the drafter up on the prompt
        note_draft_time(draft_us);
        const uint64_t gap = iteration_ - previous_shadow_;  // plain steps since the last shadow draft
        if (gap > 1) catch_up_row_.add(std::max(0.0, draft_us - draft_token_us_) / (double) (gap - 1), iteration_);
    }
    ++shadows_;
    previous_shadow_ = iteration_;
}

void DraftLengthPolicy::observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us,
                                double rest_us) {
    n_requested = std::clamp(n_requested, 0, n_max_);
    n_drafted = std::clamp(n_drafted, 0, n_requested);
    n_accepted = std::clamp(n_accepted, 0, n_drafted);
    if (n_requested > 0) {
        // all positions fade, also those this verify did not reach: a position no longer observed
        // drifts back toward its prior instead of keeping a stale estimate. Plain steps observe no
        // acceptance (their shadow drafts, reported apart, do).
        fade();
        for (int32_t i = 0; i < n_requested && i <= n_accepted; ++i) {  // asked, and all before accepted
            tried_[i] += 1.0;
            accepted_[i] += i < n_accepted ? 1.0 : 0.0;
        }
        if (n_drafted > 0 && cost_[(size_t) n_requested].warmed) note_draft_time(draft_us / n_drafted);
    }
    cost_[(size_t) n_requested].add(draft_us + rest_us, iteration_);
}

double DraftLengthPolicy::expected_tokens(int32_t k) const {
    return tokens()[(size_t) std::clamp(k, 0, n_max_)];
}

double DraftLengthPolicy::expected_us(int32_t k) const {
    return costs()[(size_t) std::clamp(k, 0, n_max_)];
}

}  // namespace llamaspec
