// Context creation from validated options, the abort wiring, and the low-level Context binding.
#include "context.h"

#include <cmath>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"  // common
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "dict_util.h"
#include "errors.h"
#include "faults.h"
#include "gil.h"
#include "logging.h"

namespace nb = nanobind;

namespace llamaspec {

namespace {

bool abort_callback(void * data) { return static_cast<std::atomic<bool> *>(data)->load(std::memory_order_relaxed); }

// The K/V cache types llama-server accepts.
const char * const kCacheTypes[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"};

ggml_type cache_type(const std::string & name, const char * option) {
    for (const char * t : kCacheTypes) {
        if (name == t) {
            for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
                const char * n = ggml_type_name((ggml_type) i);
                if (n != nullptr && name == n) return (ggml_type) i;
            }
        }
    }
    std::string allowed;
    for (const char * t : kCacheTypes) allowed += std::string(allowed.empty() ? "" : ", ") + t;
    throw Error(ErrorKind::InvalidOption, std::string(option) + " must be one of " + allowed + ", not '" + name + "'");
}


}  // namespace

namespace {
using CP = llama_context_params;
std::string str(nb::handle v) { return nb::cast<std::string>(v); }
// The enum value an option's (validated) name stands for, `otherwise` for the remaining name.
template <typename E> E named(nb::handle v, std::initializer_list<std::pair<const char *, E>> names, E otherwise) {
    const std::string s = str(v);
    for (const auto & [name, value] : names) {
        if (s == name) return value;
    }
    return otherwise;
}
// Every context option (src/llamaspec/_options.py CONTEXT_OPTIONS).
const OptionField<CP> kContextOptions[] = {
    LLAMASPEC_OPTION_FIELD(CP, "n_ctx", n_ctx, int64_t),
    LLAMASPEC_OPTION_FIELD(CP, "n_batch", n_batch, int64_t),
    LLAMASPEC_OPTION_FIELD(CP, "n_ubatch", n_ubatch, int64_t),
    LLAMASPEC_OPTION_FIELD(CP, "n_seq_max", n_seq_max, int64_t),
    {"n_threads",  // both, unless n_threads_batch says otherwise (applied after it, below)
     [](CP & p, nb::handle v) { p.n_threads = nb::cast<int32_t>(v); }},
    LLAMASPEC_OPTION_FIELD(CP, "n_threads_batch", n_threads_batch, int32_t),
    {"type_k", [](CP & p, nb::handle v) { p.type_k = cache_type(str(v), "type_k"); }},
    {"type_v", [](CP & p, nb::handle v) { p.type_v = cache_type(str(v), "type_v"); }},
    {"flash_attn",
     [](CP & p, nb::handle v) {
         p.flash_attn_type = named(v, {{"on", LLAMA_FLASH_ATTN_TYPE_ENABLED}, {"off", LLAMA_FLASH_ATTN_TYPE_DISABLED}},
                                   LLAMA_FLASH_ATTN_TYPE_AUTO);
     }},
    LLAMASPEC_OPTION_FIELD(CP, "offload_kqv", offload_kqv, bool),
    LLAMASPEC_OPTION_FIELD(CP, "op_offload", op_offload, bool),
    LLAMASPEC_OPTION_FIELD(CP, "no_perf", no_perf, bool),
    LLAMASPEC_OPTION_FIELD(CP, "swa_full", swa_full, bool),
    LLAMASPEC_OPTION_FIELD(CP, "kv_unified", kv_unified, bool),
    {"rope_scaling_type",
     [](CP & p, nb::handle v) {
         p.rope_scaling_type = named(v,
                                     {{"none", LLAMA_ROPE_SCALING_TYPE_NONE},
                                      {"linear", LLAMA_ROPE_SCALING_TYPE_LINEAR},
                                      {"yarn", LLAMA_ROPE_SCALING_TYPE_YARN},
                                      {"longrope", LLAMA_ROPE_SCALING_TYPE_LONGROPE}},
                                     LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED);
     }},
    {"attention_type",
     [](CP & p, nb::handle v) {
         p.attention_type = named(v, {{"causal", LLAMA_ATTENTION_TYPE_CAUSAL}, {"non_causal", LLAMA_ATTENTION_TYPE_NON_CAUSAL}},
                                  LLAMA_ATTENTION_TYPE_UNSPECIFIED);
     }},
    LLAMASPEC_OPTION_FIELD(CP, "rope_freq_base", rope_freq_base, float),
    LLAMASPEC_OPTION_FIELD(CP, "rope_freq_scale", rope_freq_scale, float),
    LLAMASPEC_OPTION_FIELD(CP, "yarn_ext_factor", yarn_ext_factor, float),
    LLAMASPEC_OPTION_FIELD(CP, "yarn_attn_factor", yarn_attn_factor, float),
    LLAMASPEC_OPTION_FIELD(CP, "yarn_beta_fast", yarn_beta_fast, float),
    LLAMASPEC_OPTION_FIELD(CP, "yarn_beta_slow", yarn_beta_slow, float),
    LLAMASPEC_OPTION_FIELD(CP, "yarn_orig_ctx", yarn_orig_ctx, int64_t),
};
}  // namespace

llama_context_params context_params_from_dict(const nb::dict & o) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = 2048;
    const int32_t threads = common_cpu_get_num_math();
    p.n_threads = threads;
    p.no_perf = true;
    p.n_threads_batch = -1;  // unset: follows n_threads
    apply_options(p, o, kContextOptions, "context option");
    if (p.n_threads_batch < 0) p.n_threads_batch = p.n_threads;
    if (p.n_ubatch > p.n_batch) p.n_ubatch = p.n_batch;
    return p;
}

std::vector<std::string> context_option_names() { return option_names(kContextOptions); }

std::shared_ptr<Context> Context::create(std::shared_ptr<Model> model, const llama_context_params & params,
                                         std::shared_ptr<Context> other) {
    if (model->vocab_only()) {
        throw Error(ErrorKind::InvalidOption,
                    "model '" + model->path() + "' was loaded with vocab_only=True and cannot run a context");
    }
    if (params.ctx_type == LLAMA_CONTEXT_TYPE_MTP) {
        // llama.cpp aborts the process (GGML_ASSERT) when the MTP graph misses its weights: check first.
        if (llama_model_n_layer_nextn(model->get()) <= 0) {
            throw Error(ErrorKind::UnsupportedModel,
                        "'" + model->path() + "' has no MTP layers (its nextn_predict_layers metadata is 0 or absent), "
                        "so it cannot draft for itself with MTP", 0, false, model->path());
        }
        if (!model->mtp_loaded()) {
            throw Error(ErrorKind::UnsupportedModel,
                        "'" + model->path() + "' was loaded with load_mtp=False: its MTP layers were skipped; "
                        "load it with load_mtp=True to use MTP", 0, false, model->path());
        }
    }
    // a model whose RPC worker failed stays failed: a new context would reconnect to a restarted
    // worker, which does not hold this model's weights
    model->check_backend(nullptr);
    std::shared_ptr<Context> c(new Context());
    c->params_ = params;
    c->params_.abort_callback = abort_callback;
    c->params_.abort_callback_data = &c->abort_;
    if (other) {
        c->params_.ctx_other = other->get();
        c->other_ = other;
    }
    c->model_ = std::move(model);
    LogCapture capture;
    c->ctx_ = llama_init_from_model(c->model_->get(), c->params_);
    if (c->ctx_ == nullptr) {
        std::string why = capture.summary();
        throw Error(ErrorKind::Generic, "failed to create a llama.cpp context for '" + c->model_->path() + "'" +
                                            (why.empty() ? std::string() : ": " + why));
    }
    c->attach_threadpools();
    return c;
}

void Context::attach_threadpools() {
    if (other_ && other_->threadpool_ != nullptr && params_.n_threads == other_->params_.n_threads &&
        params_.n_threads_batch == other_->params_.n_threads_batch) {
        llama_attach_threadpool(ctx_, other_->threadpool_, other_->threadpool_batch_);
        shares_threadpools_ = true;
        return;
    }
    // Looked up through the CPU backend's registry, as common does, so that this also works when
    // the backends are built as loadable modules.
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) return;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto * tp_new = (decltype(ggml_threadpool_new) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    threadpool_free_ = (decltype(ggml_threadpool_free) *) ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    if (tp_new == nullptr || threadpool_free_ == nullptr) return;

    ggml_threadpool_params tpp = ggml_threadpool_params_default(params_.n_threads);
    ggml_threadpool_params tpp_batch = ggml_threadpool_params_default(params_.n_threads_batch);
    if (!ggml_threadpool_params_match(&tpp, &tpp_batch)) {
        threadpool_batch_ = tp_new(&tpp_batch);
        tpp.paused = true;  // as upstream: the generation pool starts paused when both exist
    }
    threadpool_ = tp_new(&tpp);
    if (threadpool_ == nullptr) {  // fall back to ggml's per-decode pools
        if (threadpool_batch_ != nullptr) threadpool_free_(threadpool_batch_);
        threadpool_batch_ = nullptr;
        return;
    }
    llama_attach_threadpool(ctx_, threadpool_, threadpool_batch_);
}

Context::~Context() {
    GilReleasedIfHeld nogil;  // freeing the KV cache and compute buffers takes long
    if (const int ms = fault_value(Fault::SlowFreeMs)) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (ctx_ != nullptr) {
        if (threadpool_ != nullptr || shares_threadpools_) llama_detach_threadpool(ctx_);
        llama_free(ctx_);
    }
    if (threadpool_free_ != nullptr) {
        if (threadpool_ != nullptr) threadpool_free_(threadpool_);
        if (threadpool_batch_ != nullptr) threadpool_free_(threadpool_batch_);
    }
#if defined(__GLIBC__)
    // glibc keeps freed heap pages for reuse (llama.cpp's buffers and the prompt cache's
    // checkpoints mostly fall under its raised mmap threshold): without this a process that opens
    // and closes sessions grew with each one, though nothing leaked (RSS 239 -> 670 MB over 12
    // MTP chat sessions in bench/results/prompt_cache-2026-12-04-1659.md)
    malloc_trim(0);
#endif
}

void Context::pause_threadpools() {
    // shared pools are paused by their owner; the CPU backend is linked in (its registry offers no
    // pause), as for ggml_threadpool_params_default above
    if (threadpool_ != nullptr) ggml_threadpool_pause(threadpool_);
    if (threadpool_batch_ != nullptr) ggml_threadpool_pause(threadpool_batch_);
}

void Context::clear_memory() { llama_memory_clear(llama_get_memory(ctx_), true); }

int Context::decode(const llama_token * tokens, size_t n, llama_pos pos0) {
    const size_t n_batch = std::max<uint32_t>(1, llama_n_batch(ctx_));
    llama_batch batch = llama_batch_init((int32_t) std::min(n, n_batch), 0, 1);
    int rc = 0;
    for (size_t start = 0; start < n && rc == 0; start += n_batch) {
        const size_t len = std::min(n_batch, n - start);
        batch.n_tokens = 0;
        for (size_t i = 0; i < len; ++i) {
            batch_add(batch, tokens[start + i], pos0 + (llama_pos) (start + i), start + i == n - 1);
        }
        rc = llama_decode(ctx_, batch);
    }
    llama_batch_free(batch);
    return rc;
}

// ---------------------------------------------------------------------------------------------------
// bindings: the low-level Context (sessions build theirs from the same options)

namespace {
// A direct call's hold on a context (try_lease): BusyError while a session's engine holds it.
struct DirectUse {
    Context & c;
    explicit DirectUse(Context & ctx) : c(ctx) {
        if (!c.try_lease()) {
            throw Error(ErrorKind::Busy, "this context is in use: its session is generating, or another thread "
                                         "is calling it");
        }
        c.note_direct_use();
        // a session's engine left its prompt cache in the memory: the direct user gets it empty, as
        // a session's context always was between calls
        if (c.take_engine_cache()) c.clear_memory();
    }
    ~DirectUse() { c.end_lease(); }
    DirectUse(const DirectUse &) = delete;
    DirectUse & operator=(const DirectUse &) = delete;
};
}  // namespace

void register_context(nb::module_ & m) {
    nb::class_<Context>(m, "Context", "A llama.cpp context on a Model (native core; use llamaspec.Context).")
        .def_static(
            "create",
            [](std::shared_ptr<Model> model, nb::typed<nb::dict, nb::str, nb::any> options) {
                llama_context_params p = context_params_from_dict(options);
                // decode() asks for the last token's row only, and llama.cpp wants room for one
                // row per sequence: reserve that, not its default of n_batch rows (ADR 0033)
                p.n_outputs_max = std::max<uint32_t>(1, p.n_seq_max);
                p.n_outputs_max_per_seq = 1;
                nb::gil_scoped_release nogil;
                return Context::create(std::move(model), p);
            },
            nb::arg("model"), nb::arg("options"))
        .def_prop_ro("n_ctx", &Context::n_ctx)
        .def_prop_ro("n_batch", [](const Context & c) { return llama_n_batch(c.get()); })
        .def_prop_ro("n_ubatch", [](const Context & c) { return llama_n_ubatch(c.get()); })
        .def_prop_ro("n_seq_max", [](const Context & c) { return llama_n_seq_max(c.get()); })
        .def_prop_ro("n_threads", [](const Context & c) { return llama_n_threads(c.get()); })
        .def_prop_ro("n_threads_batch", [](const Context & c) { return llama_n_threads_batch(c.get()); })
        .def("clear",
             [](Context & c) {
                 DirectUse use(c);
                 nb::gil_scoped_release nogil;
                 c.clear_memory();
             },
             "Empty the KV cache and recurrent state.")
        .def("decode",
             [](Context & c, const std::vector<llama_token> & tokens, int pos0) {
                 for (llama_token t : tokens) c.model()->check_token(t);
                 DirectUse use(c);
                 int rc;
                 {
                     nb::gil_scoped_release nogil;
                     c.clear_abort();
                     rc = c.decode(tokens.data(), tokens.size(), pos0);
                     c.model()->check_backend(c.get());  // a failed RPC worker first: it makes rc -3 too
                 }
                 if (rc == 2) {
                     throw Error::with_code(ErrorKind::Decode, "decode was aborted", rc);
                 }
                 if (rc != 0) {
                     throw Error::with_code(ErrorKind::Decode, "llama_decode failed with code " + std::to_string(rc), rc);
                 }
             },
             nb::arg("tokens"), nb::arg("pos0"), "Decode tokens (releases the GIL); logits for the last one.")
        .def("logits",
             [](Context & c) {
                 DirectUse use(c);
                 c.model()->check_backend(nullptr);  // a failed RPC worker's rows are zeros
                 const float * l = llama_get_logits_ith(c.get(), -1);
                 if (l == nullptr) throw Error(ErrorKind::Generic, "no logits: decode something first");
                 const size_t n = (size_t) c.model()->n_vocab();
                 float * copy = new float[n];
                 std::memcpy(copy, l, n * sizeof(float));
                 nb::capsule owner(copy, [](void * p) noexcept { delete[] (float *) p; });
                 return nb::ndarray<nb::numpy, float, nb::ndim<1>>(copy, {n}, owner);
             },
             "The logits of the last decoded token, as a new numpy array.")
        .def("request_abort", &Context::request_abort, "Make the decode in progress return as aborted.")
        .def("perf",
             [](const Context & c) {
                 const llama_perf_context_data d = llama_perf_context(c.get());
                 nb::typed<nb::dict, nb::str, nb::any> out;
                 out["load_ms"] = d.t_load_ms;
                 out["prompt_eval_ms"] = d.t_p_eval_ms;
                 out["eval_ms"] = d.t_eval_ms;
                 out["prompt_tokens"] = d.n_p_eval;
                 out["eval_runs"] = d.n_eval;
                 out["graphs_reused"] = d.n_reused;
                 return out;
             },
             "llama.cpp's own performance counters of this context (zeros when created with no_perf).")
        .def("perf_reset", [](Context & c) { llama_perf_context_reset(c.get()); },
             "Reset llama.cpp's performance counters.");
}

}  // namespace llamaspec
