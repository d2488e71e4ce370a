// Chat: a conversation (with tools) through common's chat API, and the parser that turns the generated
// text back into a message (content, reasoning, tool calls), whole or token by token (ADR 0026).
//
// chat_params() renders the template and returns what generating with it needs: the prompt, the
// sampling fields of the tool-call grammar (lazy with its triggers, or forced for tool_choice
// "required"), the tokens the output must keep as text, the extra stop strings, and the serialized
// parser of the template's output format. ChatParser re-parses the text generated so far after each
// token, as llama-server does, and reports what changed as deltas in the order OpenAI streams them: a
// tool call's name (with its id) first, once complete, then pieces of its arguments.
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "chat.h"    // common
#include "common.h"  // common
#include "json.h"    // common
#include "errors.h"
#include "logging.h"
#include "model.h"

namespace nb = nanobind;

namespace llamaspec {

namespace {

common_json parse_json(const std::string & text, const char * what) {
    try {
        return common_json::parse(text);
    } catch (const std::exception & e) {
        throw Error(ErrorKind::InvalidOption, std::string(what) + " is not valid JSON: " + e.what());
    }
}

// The template's output, as the dict the Python face reads (llamaspec/chat.py, ChatPrompt).
nb::typed<nb::dict, nb::str, nb::any> chat_params(const Model & model, const std::string & messages_json, bool add_generation_prompt,
                     int enable_thinking, const std::vector<std::pair<std::string, std::string>> & kwargs,
                     const std::string & template_override, const std::string & tools_json,
                     const std::string & tool_choice, int parallel_tool_calls, const std::string & reasoning_format) {
    common_chat_templates_inputs in;
    common_chat_params out;
    {
        nb::gil_scoped_release nogil;
        try {
            in.messages = common_chat_msgs_parse_oaicompat(parse_json(messages_json, "messages"));
            in.tools = common_chat_tools_parse_oaicompat(parse_json(tools_json, "tools"));
            in.tool_choice = common_chat_tool_choice_parse_oaicompat(tool_choice);
            in.reasoning_format = common_reasoning_format_from_name(reasoning_format);
        } catch (const Error &) {
            throw;
        } catch (const std::exception & e) {
            throw Error(ErrorKind::InvalidOption, e.what());
        }
        if (in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && in.tools.empty()) {
            throw Error(ErrorKind::InvalidOption, "tool_choice 'required' needs at least one tool");
        }
        in.add_generation_prompt = add_generation_prompt;
        in.use_jinja = true;
        in.parallel_tool_calls = parallel_tool_calls == 1;
        for (const auto & kv : kwargs) in.chat_template_kwargs[kv.first] = kv.second;
        if (enable_thinking >= 0) {
            in.enable_thinking = enable_thinking == 1;
            in.chat_template_kwargs["enable_thinking"] = enable_thinking == 1 ? "true" : "false";
        }
        out = model.chat_params(in, template_override);
    }

    // The sampling side, resolved to token ids as llama-server's request reader does: a preserved
    // token is one that must come out as its text; a trigger word that is one preserved token
    // triggers on that token.
    const llama_vocab * vocab = model.vocab();
    std::set<llama_token> preserved;
    for (const std::string & t : out.preserved_tokens) {
        std::vector<llama_token> ids = common_tokenize(vocab, t, false, true);
        if (ids.size() == 1) preserved.insert(ids[0]);
    }
    nb::list triggers;
    for (const common_grammar_trigger & t : out.grammar_triggers) {
        common_grammar_trigger_type type = t.type;
        llama_token token = t.token;
        if (type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) {
            std::vector<llama_token> ids = common_tokenize(vocab, t.value, false, true);
            if (ids.size() == 1 && preserved.count(ids[0])) {
                type = COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN;
                token = ids[0];
            }
        }
        triggers.append(nb::make_tuple((int) type, t.value, (int) token));
    }
    if (out.grammar_lazy && !out.grammar.empty() && triggers.size() == 0) {
        throw Error(ErrorKind::ChatTemplate, "the template's tool grammar is lazy but has no triggers");
    }

    nb::typed<nb::dict, nb::str, nb::any> d;
    d["prompt"] = out.prompt;
    d["format"] = (int) out.format;
    d["format_name"] = common_chat_format_name(out.format);
    d["parser"] = out.parser;  // JSON text (common_peg_arena::save)
    d["generation_prompt"] = out.generation_prompt;
    d["grammar"] = out.grammar;
    d["grammar_lazy"] = out.grammar_lazy;
    d["grammar_triggers"] = triggers;
    d["preserved_tokens"] = std::vector<llama_token>(preserved.begin(), preserved.end());
    d["additional_stops"] = out.additional_stops;
    d["parse_tool_calls"] = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    return d;
}

// llama-server's tool-call id: 32 letters and digits.
std::string random_id() {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<size_t> pick(0, sizeof(chars) - 2);
    std::string s(32, ' ');
    for (char & c : s) c = chars[pick(rng)];
    return s;
}

}  // namespace

// A delta of the parsed message: kind 0 reasoning text, 1 content text, 2 a tool call's start (index,
// id, name), 3 a piece of a tool call's arguments (index, text).
using ChatDelta = std::tuple<int, int, std::string, std::string>;

class ChatParser {
public:
    ChatParser(int format, const std::string & parser, const std::string & generation_prompt,
               const std::string & reasoning_format, bool parse_tool_calls) {
        params_.format = (common_chat_format) format;
        params_.generation_prompt = generation_prompt;
        params_.parse_tool_calls = parse_tool_calls;
        try {
            params_.reasoning_format = common_reasoning_format_from_name(reasoning_format);
            if (!parser.empty()) params_.parser.load(parser);
        } catch (const std::exception & e) {
            throw Error(ErrorKind::InvalidOption, std::string("chat parser: ") + e.what());
        }
    }

    // Adds generated text and re-parses (final: no more text comes). A partial parse that fails or
    // goes back on what was reported waits for more text; a final one that fails keeps the message
    // as last parsed (what was streamed stays true).
    std::vector<ChatDelta> update(const std::string & text, bool final) {
        LogCapture quiet;  // common logs a failed final parse; the message as last parsed stands
        text_ += text;
        std::vector<ChatDelta> out;
        try {
            common_chat_msg next = common_chat_parse(text_, !final, params_);
            if (!next.empty()) {
                for (size_t i = 0; i < next.tool_calls.size(); ++i) {
                    if (ids_.size() <= i) ids_.push_back(next.tool_calls[i].id.empty() ? random_id() : next.tool_calls[i].id);
                    next.tool_calls[i].id = ids_[i];
                }
                std::vector<common_chat_msg_diff> diffs = common_chat_msg_diff::compute_diffs(msg_, next);
                msg_ = std::move(next);
                for (const common_chat_msg_diff & d : diffs) emit(d, final, out);
            }
        } catch (const std::exception &) {
            // the text so far does not parse (yet): report nothing for it
        }
        if (final) flush_names(SIZE_MAX, out);
        return out;
    }

    nb::typed<nb::dict, nb::str, nb::any> message() const {
        nb::typed<nb::dict, nb::str, nb::any> d;
        d["content"] = msg_.content;
        d["reasoning_content"] = msg_.reasoning_content;
        nb::list calls;
        for (const auto & tc : msg_.tool_calls) calls.append(nb::make_tuple(tc.id, tc.name, tc.arguments));
        d["tool_calls"] = calls;
        return d;
    }

private:
    // Sends the start of every tool call whose name is known and not sent yet, but `keep` (its name
    // may still grow while only it changes).
    void flush_names(size_t keep, std::vector<ChatDelta> & out) {
        for (size_t i = 0; i < msg_.tool_calls.size(); ++i) {
            if (i == keep || sent_.count(i) || msg_.tool_calls[i].name.empty()) continue;
            out.emplace_back(2, (int) i, msg_.tool_calls[i].id, msg_.tool_calls[i].name);
            sent_.insert(i);
        }
    }

    // llama-server's filtered order (server-task.cpp, update_chat_msg): a call's name goes out once
    // something else comes after it (its arguments or another delta), then only argument pieces.
    void emit(const common_chat_msg_diff & d, bool final, std::vector<ChatDelta> & out) {
        const bool is_call = d.tool_call_index != std::string::npos;
        const bool args = is_call && !d.tool_call_delta.arguments.empty();
        flush_names(is_call && !args ? d.tool_call_index : SIZE_MAX, out);
        if (!d.reasoning_content_delta.empty()) out.emplace_back(0, -1, d.reasoning_content_delta, "");
        if (!d.content_delta.empty()) out.emplace_back(1, -1, d.content_delta, "");
        if (!is_call) return;
        const size_t i = d.tool_call_index;
        if (!sent_.count(i) && (args || final) && !msg_.tool_calls[i].name.empty()) {
            out.emplace_back(2, (int) i, msg_.tool_calls[i].id, msg_.tool_calls[i].name);
            sent_.insert(i);
        }
        if (args && sent_.count(i)) out.emplace_back(3, (int) i, d.tool_call_delta.arguments, "");
    }

    common_chat_parser_params params_;
    std::string text_;
    common_chat_msg msg_;
    std::vector<std::string> ids_;
    std::set<size_t> sent_;
};

void register_chat(nb::module_ & m) {
    m.def("chat_params", &chat_params, nb::arg("model"), nb::arg("messages_json"), nb::arg("add_generation_prompt"),
          nb::arg("enable_thinking"), nb::arg("kwargs"), nb::arg("template_override"), nb::arg("tools_json"),
          nb::arg("tool_choice"), nb::arg("parallel_tool_calls"), nb::arg("reasoning_format"),
          "The chat template applied through common's chat API: a dict with the prompt, the tool-call "
          "grammar's sampling fields, preserved token ids, extra stops and the output parser.");

    nb::class_<ChatParser>(m, "ChatParser", "Parses generated text into a chat message (native core; use "
                                            "llamaspec.ChatPrompt.parser()).")
        .def(nb::init<int, const std::string &, const std::string &, const std::string &, bool>(), nb::arg("format"),
             nb::arg("parser"), nb::arg("generation_prompt"), nb::arg("reasoning_format"), nb::arg("parse_tool_calls"))
        .def("update", &ChatParser::update, nb::arg("text"), nb::arg("final"), nb::call_guard<nb::gil_scoped_release>(),
             "Adds text; returns the deltas as (kind, index, a, b): 0 reasoning (a), 1 content (a), 2 a tool call's "
             "start (index, id a, name b), 3 arguments (index, a).")
        .def("message", &ChatParser::message, "The message as parsed so far: content, reasoning_content, "
                                              "tool_calls [(id, name, arguments)].");
}

}  // namespace llamaspec
