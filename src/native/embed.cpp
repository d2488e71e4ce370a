// Embeddings: a context of its own on a Model (embeddings on, a pooling type), fed the inputs packed
// into batches of whole sequences as llama.cpp's llama-embedding does, one pooled vector per input
// (ADR 0027).
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"  // common
#include "context.h"
#include "errors.h"
#include "logging.h"
#include "model.h"

namespace nb = nanobind;

namespace llamaspec {

// Owns one Context (context.h: a llama_context and its CPU thread pools) with embeddings on. Not shared
// between threads at once: embed() holds a mutex for the call (taken without the GIL). Keeps the Model
// alive (shared_ptr), as every native context does.

class Embedder {
public:
    // pooling: a llama_pooling_type, or -1 for the model's own (LLAMA_POOLING_TYPE_UNSPECIFIED).
    Embedder(std::shared_ptr<Model> model, int n_ctx, int pooling, int n_threads) : model_(std::move(model)) {
        if (llama_model_has_encoder(model_->get()) && llama_model_has_decoder(model_->get())) {
            throw Error(ErrorKind::UnsupportedModel, "embeddings of encoder-decoder models are not supported");
        }
        llama_context_params p = llama_context_default_params();
        p.embeddings = true;
        p.pooling_type = (enum llama_pooling_type) pooling;
        p.n_ctx = (uint32_t) n_ctx;
        // As llama-embedding: a non-causal model (BERT) needs a whole input in one ubatch; a decoder keeps
        // llama.cpp's ubatch (its logits buffer and graph are sized by the ubatch, times the vocabulary).
        p.n_batch = (uint32_t) n_ctx;
        p.n_ubatch = model_->causal_attention() ? std::min<uint32_t>(p.n_ubatch, p.n_batch) : p.n_batch;
        // llama.cpp reserves an output per sequence within n_batch outputs (it asserts otherwise)
        p.n_seq_max = (uint32_t) std::min<size_t>(llama_max_parallel_sequences(), (size_t) n_ctx);
        p.kv_unified = true;
        p.n_threads = p.n_threads_batch = n_threads > 0 ? n_threads : common_cpu_get_num_math();
        p.no_perf = true;
        {
            nb::gil_scoped_release nogil;
            ctx_ = Context::create(model_, p);  // thread pools of its own, freed without the GIL
        }
        pooling_ = ::llama_pooling_type(ctx_->get());
        if (pooling_ == LLAMA_POOLING_TYPE_NONE || pooling_ == LLAMA_POOLING_TYPE_RANK) {
            throw Error(ErrorKind::UnsupportedModel, "this model's pooling type gives no sentence embedding; "
                                                     "choose pooling='mean', 'cls' or 'last'");
        }
        n_embd_ = llama_model_n_embd_out(model_->get());
        // the context rounds n_ctx up; a model with absolute positions has none past its training context
        const int n_train = llama_model_n_ctx_train(model_->get());
        n_ctx_ = std::min((int) llama_n_ctx(ctx_->get()), n_train > 0 ? std::min(n_ctx, n_train) : n_ctx);
        n_seq_max_ = (int) llama_n_seq_max(ctx_->get());
    }

    // One vector of n_embd floats per input, in order (L2-normalized when asked). An input longer than
    // the context is a ContextOverflow error (the Python face truncates when asked), an empty one an
    // InvalidOption error. The GIL
    // is released but between batches, where a pending signal (Ctrl-C) ends the call.
    std::vector<std::vector<float>> embed(const std::vector<std::vector<llama_token>> & inputs, bool normalize) {
        for (size_t k = 0; k < inputs.size(); ++k) {
            if (inputs[k].empty()) throw Error(ErrorKind::InvalidOption, "input " + std::to_string(k) + " has no tokens");
            if ((int) inputs[k].size() > n_ctx_) {
                throw Error(ErrorKind::ContextOverflow, "input " + std::to_string(k) + " has " +
                                                            std::to_string(inputs[k].size()) +
                                                            " tokens, more than the embedding context (" +
                                                            std::to_string(n_ctx_) + ")");
            }
            for (llama_token t : inputs[k]) model_->check_token(t);
        }
        std::vector<std::vector<float>> out(inputs.size(), std::vector<float>(n_embd_));
        std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
        {
            nb::gil_scoped_release nogil;  // another thread's call may hold the mutex and want the GIL back
            lock.lock();
        }
        llama_batch batch = llama_batch_init(n_ctx_, 0, 1);
        struct Done {  // on every way out: the batch freed, the thread pools asleep (not polling)
            llama_batch & b;
            Context & c;
            ~Done() {
                llama_batch_free(b);
                c.pause_threadpools();
            }
        } done{batch, *ctx_};
        size_t first = 0;  // the first input of the batch being filled
        while (first < inputs.size()) {
            batch.n_tokens = 0;
            size_t k = first;
            while (k < inputs.size() && (int) (k - first) < n_seq_max_ &&
                   batch.n_tokens + (int) inputs[k].size() <= n_ctx_) {
                const auto seq = (llama_seq_id) (k - first);
                for (size_t i = 0; i < inputs[k].size(); ++i) {
                    const int j = batch.n_tokens++;
                    batch.token[j] = inputs[k][i];
                    batch.pos[j] = (llama_pos) i;
                    batch.n_seq_id[j] = 1;
                    batch.seq_id[j][0] = seq;
                    batch.logits[j] = true;
                }
                ++k;
            }
            {
                nb::gil_scoped_release nogil;
                LogCapture capture;
                llama_memory_clear(llama_get_memory(ctx_->get()), true);
                const int rc = llama_decode(ctx_->get(), batch);
                ctx_->model()->check_backend(ctx_->get());  // a failed RPC worker first: it makes rc -3 too
                if (rc != 0) {
                    throw Error(ErrorKind::Decode, "embedding pass failed: " + capture.summary());
                }
                for (size_t s = first; s < k; ++s) {
                    const float * e = llama_get_embeddings_seq(ctx_->get(), (llama_seq_id) (s - first));
                    if (e == nullptr) throw Error(ErrorKind::Decode, "no pooled embedding for input " + std::to_string(s));
                    common_embd_normalize(e, out[s].data(), n_embd_, normalize ? 2 : -1);
                }
            }
            first = k;
            if (first < inputs.size() && PyErr_CheckSignals() != 0) throw nb::python_error();
        }
        return out;
    }

    int n_embd() const { return n_embd_; }
    int n_ctx() const { return n_ctx_; }
    int pooling() const { return (int) pooling_; }

private:
    std::shared_ptr<Model> model_;
    std::shared_ptr<Context> ctx_;
    std::mutex mutex_;
    enum llama_pooling_type pooling_ = LLAMA_POOLING_TYPE_UNSPECIFIED;
    int n_embd_ = 0;
    int n_ctx_ = 0;
    int n_seq_max_ = 1;
};

void register_embed(nb::module_ & m) {
    nb::class_<Embedder>(m, "Embedder", "An embedding context on a Model (native core; use llamaspec.Model.embed).")
        .def(nb::init<std::shared_ptr<Model>, int, int, int>(), nb::arg("model"), nb::arg("n_ctx"), nb::arg("pooling"),
             nb::arg("n_threads"))
        .def("embed", &Embedder::embed, nb::arg("inputs"), nb::arg("normalize"),
             "One vector per input (token ids), L2-normalized when asked.")
        .def_prop_ro("n_embd", &Embedder::n_embd)
        .def_prop_ro("n_ctx", &Embedder::n_ctx)
        .def_prop_ro("pooling", &Embedder::pooling, "llama.cpp's pooling type in use (1 mean, 2 cls, 3 last).");
}

}  // namespace llamaspec
