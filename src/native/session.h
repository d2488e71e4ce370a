// A session: the contexts, the drafter (if any) and the engine that serve a Python Generator,
// Speculative or MTP. Plain generation is a session with no drafter.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "engine.h"

namespace llamaspec {

class Session {
public:
    // Checks the configuration against the models (every check that upstream would answer with an
    // abort is made here first and raised as a typed Error), then builds the target context
    // (n_seq sequences of n_ctx tokens each; speculative: n_rs_seq = n_draft for the rollback of
    // rejected drafts on recurrent/hybrid models, 1 + n_draft outputs per sequence), the draft
    // context when a stage needs one (MTP: the target model with ctx_type MTP; otherwise
    // `draft_model`; both built against the target) and the speculative state, in the order that
    // works (init before the first target decode). No methods: a plain session. Call without the GIL.
    static std::shared_ptr<Session> create(std::shared_ptr<Model> model, llama_context_params params,
                                           SpecConfig config, std::shared_ptr<Model> draft_model);

    // Starts a generation on a free sequence. Throws Busy (every sequence taken), ContextOverflow,
    // InvalidOption, Grammar. Call without the GIL.
    std::shared_ptr<Run> start(GenRequest req) { return engine_->start(engine_, std::move(req)); }
    const std::shared_ptr<Core> & core() const { return core_; }
    bool busy() const { return engine_->n_taken() >= core_->config.n_seq; }  // every sequence is taken
    int32_t n_running() const { return engine_->n_taken(); }                 // sequences taken
    std::vector<SeqCacheInfo> cache_info() const { return engine_->cache_info(); }
    RamCacheInfo ram_cache_info() const { return engine_->ram_cache_info(); }

private:
    static std::shared_ptr<Session> create_plain(std::shared_ptr<Model> model, llama_context_params params,
                                                 SpecConfig config, const std::shared_ptr<Model> & draft_model);
    static std::shared_ptr<Session> from_core(std::shared_ptr<Core> core);
    std::shared_ptr<Core> core_;
    std::shared_ptr<Engine> engine_;
};

// Writes an n-gram cache file for the ngram-cache method (llama-lookup-create's format) from tokens.
// Throws Error(Generic) when the file cannot be written.
void ngram_cache_create(const std::vector<llama_token> & tokens, const std::string & path);

void register_session(nanobind::module_ & m);

}  // namespace llamaspec
