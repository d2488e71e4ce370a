// Model loading, properties, tokenizer and chat templates.
#include "model.h"

#include <algorithm>
#include <optional>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "chat.h"    // common
#include "common.h"  // common
#include "json.h"    // common
#include "errors.h"
#include "gil.h"
#include "logging.h"

namespace nb = nanobind;

namespace llamaspec {

static llama_split_mode parse_split_mode(const std::string & s) {
    if (s == "none") return LLAMA_SPLIT_MODE_NONE;
    if (s == "layer") return LLAMA_SPLIT_MODE_LAYER;
    if (s == "row") return LLAMA_SPLIT_MODE_ROW;
    throw Error(ErrorKind::InvalidOption, "split_mode must be 'none', 'layer' or 'row', not '" + s + "'");
}

std::shared_ptr<Model> Model::load(const std::string & path, const ModelOptions & opts) {
    llama_model_params p = llama_model_default_params();
    p.n_gpu_layers = opts.n_gpu_layers;
    p.main_gpu = opts.main_gpu;
    p.split_mode = parse_split_mode(opts.split_mode);
    std::vector<float> split(llama_max_devices(), 0.0f);
    if (!opts.tensor_split.empty()) {
        if (opts.tensor_split.size() > split.size()) {
            throw Error(ErrorKind::InvalidOption,
                        "tensor_split has " + std::to_string(opts.tensor_split.size()) + " entries; this build supports at most " +
                            std::to_string(split.size()) + " devices");
        }
        std::copy(opts.tensor_split.begin(), opts.tensor_split.end(), split.begin());
        p.tensor_split = split.data();
    }
    p.load_mtp = opts.load_mtp;
    // use_mmap=True keeps llama.cpp's own default (AUTO: mmap where the backend allows it).
    p.load_mode = opts.use_mmap ? (opts.use_mlock ? LLAMA_LOAD_MODE_MMAP_MLOCK : LLAMA_LOAD_MODE_AUTO)
                                : (opts.use_mlock ? LLAMA_LOAD_MODE_MLOCK : LLAMA_LOAD_MODE_NONE);
    p.vocab_only = opts.vocab_only;
    p.check_tensors = opts.check_tensors;
    p.use_extra_bufts = opts.use_extra_bufts;
    if (opts.progress) {
        p.progress_callback = [](float progress, void * user) {
            return (*static_cast<const std::function<bool(float)> *>(user))(progress);
        };
        p.progress_callback_user_data = const_cast<std::function<bool(float)> *>(&opts.progress);
    }

    LogCapture capture;
    RpcWorkers rpc;
    std::vector<ggml_backend_dev_t> devices;
    if (!opts.rpc_servers.empty()) {
        // as llama.cpp orders them: the workers first (fewer transfers over the network), then the
        // local GPUs; the list replaces llama.cpp's default (every local GPU), for this model only
        rpc.connect(opts.rpc_servers, opts.rpc_timeout_s, devices);
        for (ggml_backend_dev_t d : local_gpus()) devices.push_back(d);
        devices.push_back(nullptr);
        p.devices = devices.data();
    }
    llama_model * raw = llama_model_load_from_file(path.c_str(), p);
    if (!rpc.empty()) {
        // a worker that failed while the weights went over: what it holds is not the model
        try {
            rpc.check();
        } catch (const Error & e) {
            if (raw != nullptr) llama_model_free(raw);
            throw Error(ErrorKind::ModelLoad, "failed to load model '" + path + "': " + e.what(), 0, false, path);
        }
    }
    if (raw == nullptr) {
        std::string why = capture.summary();
        if (capture.contains("unknown model architecture") || capture.contains("unsupported model architecture")) {
            throw Error(ErrorKind::UnsupportedModel,
                        "llama.cpp does not support the architecture of '" + path + "': " + why, 0, false, path);
        }
        throw Error(ErrorKind::ModelLoad,
                    "failed to load model '" + path + "'" + (why.empty() ? std::string() : ": " + why), 0, false, path);
    }
    std::shared_ptr<Model> m(new Model());
    m->model_ = raw;
    m->vocab_ = llama_model_get_vocab(raw);
    m->path_ = path;
    m->vocab_only_ = opts.vocab_only;
    m->mtp_loaded_ = opts.load_mtp && !opts.vocab_only;
    m->rpc_ = std::move(rpc);
    return m;
}

void Model::check_backend(llama_context * ctx) const {
    if (rpc_.empty()) return;
    if (ctx != nullptr) llama_synchronize(ctx);  // a failure shows once the results were due
    rpc_.check();
}

Model::~Model() {
    GilReleasedIfHeld nogil;  // freeing the weights takes long
    chat_templates_.reset();
    if (model_ != nullptr) {
        llama_model_free(model_);
    }
}

void Model::check_token(llama_token id) const {
    if (id < 0 || id >= n_vocab()) {
        throw Error(ErrorKind::InvalidOption,
                    "token id " + std::to_string(id) + " is out of range [0, " + std::to_string(n_vocab()) + ")");
    }
}

std::vector<llama_token> Model::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    return common_tokenize(vocab_, text, add_special, parse_special);
}

const std::vector<std::pair<std::string, llama_token>> & Model::control_tokens() const {
    std::call_once(control_once_, [this] {
        const int32_t n = llama_vocab_n_tokens(vocab_);
        for (llama_token id = 0; id < n; ++id) {
            if (llama_vocab_get_attr(vocab_, id) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN)) {
                const char * text = llama_vocab_get_text(vocab_, id);
                if (text != nullptr && *text != '\0') control_tokens_.emplace_back(text, id);
            }
        }
        std::stable_sort(control_tokens_.begin(), control_tokens_.end(),
                         [](const auto & a, const auto & b) { return a.first.size() > b.first.size(); });
    });
    return control_tokens_;
}

std::vector<llama_token> Model::tokenize_segments(const std::vector<std::pair<std::string, bool>> & segments,
                                                  bool add_special) const {
    // A fragment is raw text (token == LLAMA_TOKEN_NULL) or one control token. Only raw fragments
    // of trusted segments are searched for control-token text, longest token first, as llama.cpp does.
    struct Fragment {
        std::string text;
        llama_token token;
        bool trusted;
    };
    std::vector<Fragment> frags;
    for (const auto & [text, trusted] : segments) {
        if (!text.empty()) frags.push_back({text, LLAMA_TOKEN_NULL, trusted});
    }
    for (const auto & [special, id] : control_tokens()) {
        std::vector<Fragment> next;
        next.reserve(frags.size());
        for (auto & f : frags) {
            if (f.token != LLAMA_TOKEN_NULL || !f.trusted || f.text.find(special) == std::string::npos) {
                next.push_back(std::move(f));
                continue;
            }
            size_t from = 0;
            for (size_t at; (at = f.text.find(special, from)) != std::string::npos; from = at + special.size()) {
                if (at > from) next.push_back({f.text.substr(from, at - from), LLAMA_TOKEN_NULL, true});
                next.push_back({special, id, true});
            }
            if (from < f.text.size()) next.push_back({f.text.substr(from), LLAMA_TOKEN_NULL, true});
        }
        frags = std::move(next);
    }
    std::vector<llama_token> out;
    if (add_special && llama_vocab_get_add_bos(vocab_)) out.push_back(llama_vocab_bos(vocab_));
    std::string raw;
    auto flush = [&] {
        if (raw.empty()) return;
        for (llama_token t : common_tokenize(vocab_, raw, false, false)) out.push_back(t);
        raw.clear();
    };
    for (const auto & f : frags) {
        if (f.token == LLAMA_TOKEN_NULL) {
            raw += f.text;  // raw text joins across segments, as in one string
        } else {
            flush();
            out.push_back(f.token);
        }
    }
    flush();
    if (add_special && llama_vocab_get_add_eos(vocab_)) out.push_back(llama_vocab_eos(vocab_));
    return out;
}

std::string Model::detokenize(const std::vector<llama_token> & ids, bool special) const {
    for (llama_token id : ids) check_token(id);
    return common_detokenize(vocab_, ids, special);
}

std::string Model::token_to_piece(llama_token id, bool special) const {
    check_token(id);
    return common_token_to_piece(vocab_, id, special);
}

std::string Model::meta(const std::string & key) const {
    int32_t n = llama_model_meta_val_str(model_, key.c_str(), nullptr, 0);
    if (n < 0) return {};
    std::string buf(n + 1, '\0');
    llama_model_meta_val_str(model_, key.c_str(), buf.data(), buf.size());
    buf.resize(n);
    return buf;
}

bool Model::causal_attention() const { return meta(meta("general.architecture") + ".attention.causal") != "false"; }

common_chat_params Model::chat_params(const common_chat_templates_inputs & inputs,
                                      const std::string & template_override) const {
    LogCapture capture;
    try {
        std::shared_ptr<common_chat_templates> tmpls;
        if (template_override.empty()) {
            std::lock_guard<std::mutex> lock(chat_mutex_);
            if (!chat_templates_) {
                chat_templates_ = std::shared_ptr<common_chat_templates>(common_chat_templates_init(model_, "").release(),
                                                                         common_chat_templates_deleter());
            }
            tmpls = chat_templates_;
        } else {
            tmpls = std::shared_ptr<common_chat_templates>(common_chat_templates_init(model_, template_override).release(),
                                                           common_chat_templates_deleter());
        }
        return common_chat_templates_apply(tmpls.get(), inputs);
    } catch (const Error &) {
        throw;
    } catch (const std::exception & e) {
        std::string why = e.what();
        std::string logged = capture.summary();
        if (!logged.empty()) why += " (" + logged + ")";
        throw Error(ErrorKind::ChatTemplate, "chat template failed: " + why);
    }
}

// ---------------------------------------------------------------------------------------------------
// bindings

static nb::bytes to_bytes(const std::string & s) { return nb::bytes(s.data(), s.size()); }

void register_model(nb::module_ & m) {
    nb::class_<Model>(m, "Model", "A loaded GGUF model (native core; use llamaspec.Model).")
        .def_static(
            "load",
            [](const std::string & path, int n_gpu_layers, int main_gpu, const std::string & split_mode,
               const std::vector<float> & tensor_split, bool load_mtp, bool use_mmap, bool use_mlock, bool vocab_only,
               bool check_tensors, bool use_extra_bufts, const std::vector<std::string> & rpc_servers,
               double rpc_timeout, nb::object progress) {
                ModelOptions o;
                o.n_gpu_layers = n_gpu_layers;
                o.main_gpu = main_gpu;
                o.split_mode = split_mode;
                o.tensor_split = tensor_split;
                o.load_mtp = load_mtp;
                o.use_mmap = use_mmap;
                o.use_mlock = use_mlock;
                o.vocab_only = vocab_only;
                o.check_tensors = check_tensors;
                o.use_extra_bufts = use_extra_bufts;
                o.rpc_servers = rpc_servers;
                o.rpc_timeout_s = rpc_timeout;
                // The progress callable runs on this thread with the GIL taken back for the call;
                // returning False (or raising) cancels the load, which then raises LoadCancelledError
                // (or the callable's own exception).
                std::optional<nb::python_error> raised;
                bool cancelled = false;
                if (!progress.is_none()) {
                    o.progress = [&](float share) {
                        nb::gil_scoped_acquire gil;
                        try {
                            nb::object r = progress(share);
                            cancelled = r.is(nb::borrow(Py_False));
                        } catch (nb::python_error & e) {
                            raised.emplace(std::move(e));
                            cancelled = true;
                        }
                        return !cancelled;
                    };
                }
                std::shared_ptr<Model> m;
                try {
                    nb::gil_scoped_release nogil;
                    m = Model::load(path, o);
                } catch (const Error &) {
                    if (!cancelled) throw;
                }
                if (raised) throw std::move(*raised);
                if (cancelled) {
                    throw Error(ErrorKind::LoadCancelled, "loading '" + path + "' was cancelled by the progress callback",
                                0, false, path);
                }
                return m;
            },
            nb::arg("path"), nb::arg("n_gpu_layers"), nb::arg("main_gpu"), nb::arg("split_mode"), nb::arg("tensor_split"),
            nb::arg("load_mtp"), nb::arg("use_mmap"), nb::arg("use_mlock"), nb::arg("vocab_only"),
            nb::arg("check_tensors"), nb::arg("use_extra_bufts"), nb::arg("rpc_servers"), nb::arg("rpc_timeout"),
            nb::arg("progress").none(),
            "Load a GGUF file (releases the GIL; progress(share) is called with it held).")
        .def_prop_ro("path", &Model::path)
        .def_prop_ro("description",
                     [](const Model & self) {
                         char buf[256];
                         int n = llama_model_desc(self.get(), buf, sizeof(buf));
                         return std::string(buf, n > 0 ? std::min<size_t>(n, sizeof(buf) - 1) : 0);
                     })
        .def_prop_ro("n_params", [](const Model & self) { return llama_model_n_params(self.get()); })
        .def_prop_ro("size", [](const Model & self) { return llama_model_size(self.get()); })
        .def_prop_ro("n_ctx_train", [](const Model & self) { return llama_model_n_ctx_train(self.get()); })
        .def_prop_ro("n_embd", [](const Model & self) { return llama_model_n_embd(self.get()); })
        .def_prop_ro("n_vocab", &Model::n_vocab)
        .def_prop_ro("n_layer", [](const Model & self) { return llama_model_n_layer(self.get()); })
        .def_prop_ro("n_layer_nextn", [](const Model & self) { return llama_model_n_layer_nextn(self.get()); })
        .def_prop_ro("n_head", [](const Model & self) { return llama_model_n_head(self.get()); })
        .def_prop_ro("n_head_kv", [](const Model & self) { return llama_model_n_head_kv(self.get()); })
        .def_prop_ro("vocab_only", &Model::vocab_only)
        .def_prop_ro("mtp_loaded", &Model::mtp_loaded)
        .def_prop_ro("has_encoder", [](const Model & self) { return llama_model_has_encoder(self.get()); })
        .def_prop_ro("chat_template",
                     [](const Model & self) -> std::optional<std::string> {
                         const char * t = llama_model_chat_template(self.get(), nullptr);
                         if (t == nullptr) return std::nullopt;
                         return std::string(t);
                     })
        .def("metadata",
             [](const Model & self) {
                 nb::typed<nb::dict, nb::str, nb::str> out;
                 int32_t n = llama_model_meta_count(self.get());
                 std::vector<char> key(512), val(4096);
                 for (int32_t i = 0; i < n; ++i) {
                     int32_t kn = llama_model_meta_key_by_index(self.get(), i, key.data(), key.size());
                     if (kn < 0) continue;
                     if ((size_t) kn >= key.size()) {
                         key.resize(kn + 1);
                         llama_model_meta_key_by_index(self.get(), i, key.data(), key.size());
                     }
                     int32_t vn = llama_model_meta_val_str_by_index(self.get(), i, val.data(), val.size());
                     if (vn < 0) continue;
                     if ((size_t) vn >= val.size()) {
                         val.resize(vn + 1);
                         llama_model_meta_val_str_by_index(self.get(), i, val.data(), val.size());
                     }
                     out[nb::str(key.data(), kn)] = nb::str(val.data(), vn);
                 }
                 return out;
             },
             "Every GGUF metadata key with its value as llama.cpp renders it (arrays are abbreviated).")
        .def("meta", &Model::meta, nb::arg("key"))
        .def("tokenize",
             [](const Model & self, const std::string & text, bool add_special, bool parse_special) {
                 nb::gil_scoped_release nogil;
                 return self.tokenize(text, add_special, parse_special);
             },
             nb::arg("text"), nb::arg("add_special"), nb::arg("parse_special"))
        .def("tokenize_segments",
             [](const Model & self, const std::vector<std::pair<std::string, bool>> & segments, bool add_special) {
                 nb::gil_scoped_release nogil;
                 return self.tokenize_segments(segments, add_special);
             },
             nb::arg("segments"), nb::arg("add_special"))
        .def("detokenize",
             [](const Model & self, const std::vector<llama_token> & ids, bool special) {
                 std::string s;
                 {
                     nb::gil_scoped_release nogil;
                     s = self.detokenize(ids, special);
                 }
                 return to_bytes(s);
             },
             nb::arg("ids"), nb::arg("special"))
        .def("token_to_piece",
             [](const Model & self, llama_token id, bool special) { return to_bytes(self.token_to_piece(id, special)); },
             nb::arg("id"), nb::arg("special"))
        .def_prop_ro("bos", [](const Model & self) { return llama_vocab_bos(self.vocab()); })
        .def_prop_ro("eos", [](const Model & self) { return llama_vocab_eos(self.vocab()); })
        .def_prop_ro("eot", [](const Model & self) { return llama_vocab_eot(self.vocab()); })
        .def_prop_ro("add_bos", [](const Model & self) { return llama_vocab_get_add_bos(self.vocab()); })
        .def_prop_ro("add_eos_or_sep",
                     [](const Model & self) {
                         return llama_vocab_get_add_eos(self.vocab()) || llama_vocab_get_add_sep(self.vocab());
                     })
        .def_prop_ro("causal_attention", &Model::causal_attention,
                     "False for models that attend both ways (BERT-like embedding models).")
        .def_prop_ro("pooling_type",
                     [](const Model & self) {
                         // the GGUF's <arch>.pooling_type (embedding models name one), -1 when absent
                         const std::string v = self.meta(self.meta("general.architecture") + ".pooling_type");
                         return v.empty() ? -1 : std::stoi(v);
                     },
                     "llama.cpp's pooling type the file names (1 mean, 2 cls, 3 last, 4 rank), -1 if none.")
        .def("is_eog", [](const Model & self, llama_token id) { return llama_vocab_is_eog(self.vocab(), id); }, nb::arg("id"))
        .def("is_control", [](const Model & self, llama_token id) {
                 self.check_token(id);
                 return llama_vocab_is_control(self.vocab(), id);
             }, nb::arg("id"));
}

}  // namespace llamaspec
