// Log-probabilities of generated tokens (logprobs=True): the chosen token's and the top n, read from
// the target's raw logits at the token's row (as llama-server reports them by default), or from the
// sampler's candidates after its filters (post_sampling_probs=True).
#pragma once

#include <string>
#include <vector>

#include "llama.h"
#include "sampling.h"  // common

namespace llamaspec {

struct TopProb {
    llama_token id;
    float logprob;
    std::string piece;  // the token's bytes (possibly part of a UTF-8 character)
};

struct TokenProbs {
    float logprob = 0.0f;      // of the chosen token
    std::vector<TopProb> top;  // most likely first; ties by id
};

// What a call asks for: n_top < 0 is off.
struct ProbsRequest {
    int32_t n_top = -1;
    bool post_sampling = false;
    bool on() const { return n_top >= 0; }
};

// The probabilities at row `idx` of the last decode for the token `id` just sampled there by `smpl`
// (before it is accepted: post_sampling reads the sampler's candidates of that draw).
TokenProbs token_probs(const ProbsRequest & want, llama_context * ctx, int idx, common_sampler * smpl, llama_token id);

}  // namespace llamaspec
