// Log-probabilities of generated tokens; see logprobs.h.
#include "logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common.h"  // common

namespace llamaspec {

namespace {

// Keeps the n best (value, id) pairs seen, best first: higher value, then lower id (a stable order,
// so plain and speculative decoding list equal values alike).
struct TopN {
    struct Item {
        float v;
        llama_token id;
    };
    size_t n;
    std::vector<Item> items;
    explicit TopN(size_t k) : n(k) { items.reserve(k + 1); }
    static bool better(const Item & a, const Item & b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }
    void offer(float v, llama_token id) {
        if (items.size() == n && !better({v, id}, items.back())) return;
        Item it{v, id};
        items.insert(std::upper_bound(items.begin(), items.end(), it, better), it);
        if (items.size() > n) items.pop_back();
    }
};

// sum(exp(x[i] - max)) over a row of logits. The row is as long as the vocabulary (49,152 floats for
// SmolLM2, 150k+ for Qwen) and read once per generated token, so the exponential is computed four
// lanes at a time: Cephes' single-precision polynomial (relative error < 1e-7 for arguments down to
// -87; below that, where e^x < 2e-38, the argument is clamped), summed in eight float partial sums
// (two four-lane accumulators, each over ~n/8 terms) added in double at the end; the float sums
// keep the log-sum-exp within ~1e-5 on a 150k vocabulary. libm's exp, one value at a time, took
// ~0.5 ms per token on SmolLM2, 5% of a decode step on one thread.
#if defined(__GNUC__)
typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));

inline f4 exp_nonpositive(f4 x) {
    const f4 lo = {-87.0f, -87.0f, -87.0f, -87.0f};
    x = x > lo ? x : lo;
    const f4 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
    const f4 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;              // x - n ln 2, in two steps
    f4 p = r * 1.9875691500E-4f + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    const i4 pow2 = (__builtin_convertvector(n, i4) + 127) << 23;  // 2^n as a float's bits
    return p * (f4) pow2;
}

double sum_exp(const float * x, int32_t n, float max) {
    f4 a0 = {0, 0, 0, 0}, a1 = a0;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f4 v0, v1;
        std::memcpy(&v0, x + i, sizeof v0);
        std::memcpy(&v1, x + i + 4, sizeof v1);
        a0 += exp_nonpositive(v0 - max);
        a1 += exp_nonpositive(v1 - max);
    }
    double sum = 0.0;
    for (int k = 0; k < 4; ++k) sum += (double) a0[k] + (double) a1[k];
    for (; i < n; ++i) sum += std::exp((double) (x[i] - max));
    return sum;
}
#else
double sum_exp(const float * x, int32_t n, float max) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp((double) (x[i] - max));
    return sum;
}
#endif

float max_of(const float * x, int32_t n) {
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int k = 0; k < 4; ++k) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    }
    for (; i < n; ++i) m[0] = x[i] > m[0] ? x[i] : m[0];
    return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

std::string piece(const llama_vocab * vocab, llama_token id) { return common_token_to_piece(vocab, id, false); }

}  // namespace

TokenProbs token_probs(const ProbsRequest & want, llama_context * ctx, int idx, common_sampler * smpl, llama_token id) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    TokenProbs out;
    TopN top((size_t) std::max(0, want.n_top));
    if (want.post_sampling) {
        // the candidates of the draw that chose `id`, after the sampler's filters; removed ones have p == 0
        const llama_token_data_array * cur = common_sampler_get_candidates(smpl, true);
        out.logprob = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < cur->size; ++i) {
            const llama_token_data & d = cur->data[i];
            if (d.id == id && d.p > 0) out.logprob = std::log(d.p);
            if (d.p > 0 && top.n > 0) top.offer(d.p, d.id);
        }
        for (const auto & it : top.items) out.top.push_back({it.id, std::log(it.v), piece(vocab, it.id)});
        return out;
    }
    // the log-softmax of the raw logits: logit - (max + log(sum(exp(logit - max))))
    const float * logits = llama_get_logits_ith(ctx, idx);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const float max_l = max_of(logits, n_vocab);
    const float lse = max_l + (float) std::log(sum_exp(logits, n_vocab, max_l));
    if (top.n > 0) {
        float floor = -std::numeric_limits<float>::infinity();  // the n-th best so far, once there are n
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (logits[i] < floor) continue;
            top.offer(logits[i], i);
            if (top.items.size() == top.n) floor = top.items.back().v;
        }
    }
    out.logprob = logits[id] - lse;
    for (const auto & it : top.items) out.top.push_back({it.id, it.v - lse, piece(vocab, it.id)});
    return out;
}

}  // namespace llamaspec
