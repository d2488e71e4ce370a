// The native Model: owns one llama_model; shared (std::shared_ptr) by every context built on it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "llama.h"
#include "rpc.h"

struct common_chat_templates;
struct common_chat_templates_inputs;
struct common_chat_params;

namespace llamaspec {

struct ModelOptions {
    int n_gpu_layers = 0;
    int main_gpu = 0;
    std::string split_mode = "layer";
    std::vector<float> tensor_split;
    bool load_mtp = true;
    bool use_mmap = true;
    bool use_mlock = false;
    bool vocab_only = false;
    bool check_tensors = false;
    bool use_extra_bufts = true;
    // llama.cpp's RPC workers ("host:port"), where the offloaded layers go (before any local GPU), and
    // how long a worker may stay silent before its connection counts as failed (0: forever)
    std::vector<std::string> rpc_servers;
    double rpc_timeout_s = 0;
    // Called from the loading thread with the share loaded (0..1); false cancels the load. Empty: none.
    std::function<bool(float)> progress;
};

// Ownership: the llama_model is freed when the last shared_ptr goes, i.e. after the Python Model and
// every Context/Generator built on it are gone. All methods are const on the weights, so one Model may
// serve any number of contexts and threads at once (llama.cpp's model is read-only after loading).
class Model {
public:
    // Loads the file; throws Error(ModelLoad / UnsupportedModel). Call without the GIL.
    static std::shared_ptr<Model> load(const std::string & path, const ModelOptions & opts);
    ~Model();
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    llama_model * get() const { return model_; }
    const llama_vocab * vocab() const { return vocab_; }
    const std::string & path() const { return path_; }
    bool vocab_only() const { return vocab_only_; }
    bool mtp_loaded() const { return mtp_loaded_; }
    int32_t n_vocab() const { return llama_vocab_n_tokens(vocab_); }

    // Throws Error(InvalidOption) unless 0 <= id < n_vocab.
    void check_token(llama_token id) const;

    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<llama_token> & ids, bool special) const;
    std::string token_to_piece(llama_token id, bool special) const;
    std::string meta(const std::string & key) const;  // "" when absent

    // Tokenizes a text given as segments, recognizing control tokens (by their text) only inside
    // trusted segments: text from an untrusted segment never becomes a control token. Raw text is
    // joined across segment boundaries before it is tokenized, so the result equals tokenize(all,
    // add_special, parse_special=true) whenever the untrusted segments hold no control-token text.
    // Mirrors llama.cpp's own partition (llama_vocab::impl::tokenizer_st_partition).
    std::vector<llama_token> tokenize_segments(const std::vector<std::pair<std::string, bool>> & segments,
                                               bool add_special) const;

    // The RPC workers the model's offloaded layers sit on (whose failure check_backend reports).
    const std::vector<std::string> & rpc_endpoints() const { return rpc_.endpoints(); }

    // After a decode on ctx (a context of this model): waits for its results and throws
    // Error(Backend) if an RPC worker of the model failed meanwhile, or ever before (what ctx
    // computed is then not to be used). ctx null: the check alone. Nothing to do for a model
    // without RPC workers.
    void check_backend(llama_context * ctx) const;

    // False for models that attend both ways (BERT-like embedding models: <arch>.attention.causal = false).
    bool causal_attention() const;

    // Applies the model's chat template (or template_override) through common's chat API: the prompt,
    // and with tools the grammar, triggers and output parser that go with it (chat.cpp). Template
    // failures raise Error(ChatTemplate), malformed tools or tool_choice Error(InvalidOption).
    common_chat_params chat_params(const common_chat_templates_inputs & inputs,
                                   const std::string & template_override) const;

private:
    Model() = default;
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    std::string path_;
    bool vocab_only_ = false;
    bool mtp_loaded_ = false;
    RpcWorkers rpc_;

    // control and unknown tokens (the ones parse_special=false ignores), longest text first
    const std::vector<std::pair<std::string, llama_token>> & control_tokens() const;

    mutable std::mutex chat_mutex_;
    mutable std::once_flag control_once_;
    mutable std::vector<std::pair<std::string, llama_token>> control_tokens_;
    mutable std::shared_ptr<common_chat_templates> chat_templates_;  // built on first use
};

void register_model(nanobind::module_ & m);

}  // namespace llamaspec
