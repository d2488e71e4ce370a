// The native Context: one llama_context on a shared Model, with a cancellation flag wired to
// llama.cpp's abort callback.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "llama.h"
#include "model.h"

namespace llamaspec {

// Appends one token of sequence 0 to a batch made by llama_batch_init(n, 0, 1).
inline void batch_add(llama_batch & batch, llama_token id, llama_pos pos, bool logits) {
    const int32_t i = batch.n_tokens++;
    batch.token[i] = id;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = logits;
}

// Builds llama_context_params from the options dict that the Python face has already validated
// (names and types); values llama.cpp cannot take raise Error(InvalidOption).
llama_context_params context_params_from_dict(const nanobind::dict & options);
// The names context_params_from_dict takes (for the test that keeps them equal to Python's).
std::vector<std::string> context_option_names();

// Ownership: holds the Model (shared_ptr) so the weights outlive the context; frees the llama_context
// in its destructor. Not thread-safe: one user at a time (try_lease).
class Context {
public:
    // Creates the llama_context; throws Error. Call without the GIL. With `other`, the new context is
    // built against it (llama_context_params.ctx_other: an MTP draft context reads the target's
    // hidden rows), keeps it alive, and shares its CPU thread pools (the two never compute at once:
    // one worker thread drives both).
    static std::shared_ptr<Context> create(std::shared_ptr<Model> model, const llama_context_params & params,
                                           std::shared_ptr<Context> other = nullptr);
    ~Context();
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    llama_context * get() const { return ctx_; }
    const std::shared_ptr<Model> & model() const { return model_; }
    const llama_context_params & params() const { return params_; }
    // tokens one sequence may hold (the whole context for single-sequence contexts)
    uint32_t n_ctx() const { return llama_n_ctx_seq(ctx_); }

    // Cooperative cancellation: while set, llama_decode returns 2 at the next graph node.
    void request_abort() { abort_.store(true, std::memory_order_relaxed); }
    void clear_abort() { abort_.store(false, std::memory_order_relaxed); }
    bool abort_requested() const { return abort_.load(std::memory_order_relaxed); }

    // One user at a time: a session's engine holds its contexts for as long as its thread runs, and
    // a direct call on the context (Python's Context.decode/clear/logits) for its duration. Whoever
    // finds the context taken raises BusyError.
    bool try_lease() { return !leased_.exchange(true); }
    void end_lease() { leased_.store(false); }
    // Direct calls so far: a session's prompt cache no longer knows what the memory holds once this
    // has changed (engine.cpp drops it).
    void note_direct_use() { direct_uses_.fetch_add(1); }
    uint64_t direct_uses() const { return direct_uses_.load(); }
    // A session's engine leaves its prompt cache in the memory (set when its thread leaves); the
    // next direct user takes (and clears) it.
    void leave_engine_cache() { engine_cache_.store(true); }
    bool take_engine_cache() { return engine_cache_.exchange(false); }

    // Parks the CPU thread pools' threads (they sleep instead of spinning for new work); the next
    // decode wakes them. Only while no decode runs on this context or on one sharing its pools.
    void pause_threadpools();

    // Empties the KV cache and recurrent state of every sequence.
    void clear_memory();

    // Decodes tokens at positions [pos0, pos0 + n) of sequence 0 in chunks of n_batch, with logits for
    // the last token only. Returns llama_decode's code: 0 ok, 2 aborted, other values are errors.
    int decode(const llama_token * tokens, size_t n, llama_pos pos0);

private:
    Context() = default;
    void attach_threadpools();

    std::shared_ptr<Model> model_;
    std::shared_ptr<Context> other_;  // freed after this context (declared first, destroyed last)
    llama_context * ctx_ = nullptr;
    llama_context_params params_{};
    std::atomic<bool> abort_{false};
    std::atomic<bool> leased_{false};
    std::atomic<uint64_t> direct_uses_{0};
    std::atomic<bool> engine_cache_{false};
    // Persistent CPU thread pools (as upstream's tools attach): without them ggml creates and joins
    // a disposable pool, i.e. spawns n_threads - 1 threads, at every decode.
    ggml_threadpool * threadpool_ = nullptr;
    ggml_threadpool * threadpool_batch_ = nullptr;
    void (*threadpool_free_)(ggml_threadpool *) = nullptr;
    bool shares_threadpools_ = false;  // attached to other_'s pools (not ours to free)
};

void register_context(nanobind::module_ & m);

}  // namespace llamaspec
