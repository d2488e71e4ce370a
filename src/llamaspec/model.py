"""Model: a loaded GGUF file, its properties, tokenizer and chat template."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, overload

from . import _native
from ._chat import Renderer, chat_tokens, messages_json
from ._log import sync_log_level
from ._options import POOLING_TYPES, _bool, _choice, _int
from .chat import ChatPrompt, build_chat_prompt
from .errors import ClosedError, InvalidOptionError, ModelLoadError, UnsupportedModelError

__all__ = ["Model"]

_GGUF_MAGIC = b"GGUF"


def _rpc_servers(servers: Sequence[str] | None) -> list[str]:
    """The endpoints of ``rpc_servers`` (a list or tuple) as a list; the native side checks their form."""
    if servers is None:
        return []
    if not isinstance(servers, (list, tuple)) or not all(isinstance(s, str) for s in servers):
        raise InvalidOptionError('rpc_servers must be a list of "host:port" strings')
    if len(set(servers)) != len(servers):
        raise InvalidOptionError(f"rpc_servers names a worker twice: {list(servers)}")
    return list(servers)


def _check_model_file(path: str) -> None:
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: '{path}'", path=path)
    if os.path.isdir(path):
        raise ModelLoadError(f"'{path}' is a directory, not a GGUF model file", path=path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read '{path}': {e.strerror}", path=path) from e
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"'{path}' is not a GGUF file (magic {magic!r}, expected b'GGUF')", path=path)


class Model:
    """A GGUF model loaded by llama.cpp.

    One Model may be shared by any number of Generators (and other sessions) and threads at once:
    llama.cpp's weights are read-only after loading, and each Generator owns its own context. The
    weights stay in memory until the Model is closed AND every Generator built on it is closed or
    garbage-collected.

    Example:
        >>> with llamaspec.Model("model.gguf") as model:
        ...     print(model.description, model.n_params)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int | None = None,
        main_gpu: int = 0,
        split_mode: str = "layer",
        tensor_split: Sequence[float] | None = None,
        load_mtp: bool = True,
        use_mmap: bool = True,
        use_mlock: bool = False,
        vocab_only: bool = False,
        check_tensors: bool = False,
        use_extra_bufts: bool = True,
        rpc_servers: Sequence[str] | None = None,
        rpc_timeout: float = 120.0,
        progress: Callable[[float], bool | None] | None = None,
    ) -> None:
        """Load a GGUF file. Loading releases the GIL.

        Args:
            path: the .gguf file.
            n_gpu_layers: layers to offload to the GPUs and RPC workers; -1 offloads all. Default:
                all when ``rpc_servers`` are given, else none.
            main_gpu: the GPU used when ``split_mode`` is "none".
            split_mode: how to split across GPUs: "none", "layer" or "row".
            tensor_split: proportion of the model per GPU.
            load_mtp: load the Multi-Token-Prediction layers when the file has them.
            use_mmap: memory-map the file (llama.cpp decides where the backend allows it).
            use_mlock: lock the weights in RAM.
            vocab_only: load only the vocabulary (tokenizer and chat template, no generation).
            check_tensors: validate tensor data while loading.
            use_extra_bufts: let llama.cpp repack weights into faster CPU layouts.
            rpc_servers: llama.cpp RPC workers ("host:port", each running ``llamaspec rpc-server``
                or upstream's ``rpc-server`` of the same llama.cpp) that hold the offloaded layers,
                split by their memory unless ``tensor_split`` says otherwise; they come before
                any local GPU. The protocol has no authentication or encryption: use it on a
                network you trust.
            rpc_timeout: seconds a worker may stay silent (a long prompt chunk on a slow worker
                counts) before its connection counts as failed; 0 waits forever. It applies to the
                connections this load opens; a worker already connected in this process keeps its
                own.
            progress: called while the weights load with the share loaded so far (0.0 to 1.0), on
                the loading thread with the GIL held for the call; returning False cancels the load
                (LoadCancelledError), an exception it raises cancels it and propagates. Not called
                for ``vocab_only``.

        Raises:
            ModelLoadError: the file is missing, a directory, not GGUF, truncated or corrupt, or an
                RPC worker cannot be reached (the message names it) or failed during the load.
            LoadCancelledError: ``progress`` returned False.
            UnsupportedModelError: llama.cpp does not support the model's architecture.
            InvalidOptionError: an option has an invalid value.
        """
        self._native: _native.Model | None = None
        self._embedders: dict[tuple[int, int, int], _native.Embedder] = {}
        self._embed_lock = threading.Lock()
        p = os.fspath(path)
        if not isinstance(p, str):
            raise InvalidOptionError("path must be a str or os.PathLike[str]")
        for name, v in (("load_mtp", load_mtp), ("use_mmap", use_mmap), ("use_mlock", use_mlock),
                        ("vocab_only", vocab_only), ("check_tensors", check_tensors),
                        ("use_extra_bufts", use_extra_bufts)):
            if not isinstance(v, bool):
                raise InvalidOptionError(f"{name} must be a bool")
        servers = _rpc_servers(rpc_servers)
        if n_gpu_layers is None:
            n_gpu_layers = -1 if servers else 0
        for name, iv in (("n_gpu_layers", n_gpu_layers), ("main_gpu", main_gpu)):
            if isinstance(iv, bool) or not isinstance(iv, int):
                raise InvalidOptionError(f"{name} must be an int")
        if (isinstance(rpc_timeout, bool) or not isinstance(rpc_timeout, (int, float))
                or not 0 <= rpc_timeout <= 86400):
            raise InvalidOptionError(
                f"rpc_timeout must be between 0 (none) and 86400 seconds, not {rpc_timeout!r}")
        if split_mode not in ("none", "layer", "row"):
            raise InvalidOptionError(f"split_mode must be 'none', 'layer' or 'row'; got {split_mode!r}")
        splits = [float(x) for x in tensor_split] if tensor_split is not None else []
        if progress is not None and not callable(progress):
            raise InvalidOptionError("progress must be a callable or None")
        _check_model_file(p)
        sync_log_level()
        self._native = _native.Model.load(
            p, n_gpu_layers, main_gpu, split_mode, splits, load_mtp, use_mmap, use_mlock, vocab_only,
            check_tensors, use_extra_bufts, servers, float(rpc_timeout), progress,
        )
        self._path = p
        self._load_mtp = load_mtp

    @classmethod
    def from_pretrained(
        cls,
        repo_id: str,
        filename: str | None = None,
        *,
        quant: str | None = None,
        revision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        **options: Any,
    ) -> Model:
        """Load a GGUF file of a Hugging Face Hub repository; the first use downloads it into the
        Hub's cache (huggingface_hub, an optional dependency: ``pip install 'llamaspec[hub]'``; its
        ``HF_TOKEN`` and ``HF_HUB_OFFLINE=1`` apply).

        Args:
            repo_id: "org/name", or "org/name:QUANT" (a quantization tag, as llama.cpp's ``-hf``).
            filename: a file name or glob (e.g. "*Q8_0.gguf"); None: the GGUF with ``quant`` in its
                name, else Q4_K_M when there is one, else the first by name (never an mmproj file;
                every part of a split model is fetched).
            quant: the quantization tag (instead of the ":QUANT" suffix).
            revision: a branch, tag or commit (default: main).
            cache_dir: the Hub cache to use (default: huggingface_hub's).
            token: a Hub token (default: huggingface_hub's, e.g. ``HF_TOKEN``).
            **options: Model's own options (n_gpu_layers, progress, ...).

        Raises:
            ModelLoadError: huggingface_hub is missing, the repository or file cannot be had, no
                file matches, or loading fails.
            InvalidOptionError: a ":QUANT" tag together with ``quant`` or ``filename``.
        """
        from ._hub import hub_file, split_repo

        repo_id, tag = split_repo(repo_id)
        if tag is not None and (quant is not None or filename is not None):
            raise InvalidOptionError(f"give the quantization once: {repo_id}:{tag}, quant= or filename=")
        path = hub_file(repo_id, filename, quant=quant or tag, revision=revision,
                        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None, token=token)
        return cls(path, **options)

    # -- lifetime -------------------------------------------------------------------------------

    def _require(self) -> _native.Model:
        m = self._native
        if m is None:
            raise ClosedError("the model is closed")
        return m

    def close(self) -> None:
        """Drop this handle on the weights; they are freed once no Generator uses them. Idempotent."""
        self._native = None
        with self._embed_lock:
            self._embedders = {}

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._native is None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return f"<llamaspec.Model {self._path!r} closed>"
        return (f"<llamaspec.Model {os.path.basename(self._path)!r} {self.architecture} "
                f"{self.description!r} n_params={self.n_params} mtp_layers={self.n_layer_nextn}>")

    # -- properties -----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The file the model was loaded from."""
        return self._path

    @property
    def description(self) -> str:
        """llama.cpp's one-line description, e.g. "llama 256M Q4_1"."""
        return self._require().description

    @property
    def n_params(self) -> int:
        """Number of parameters."""
        return self._require().n_params

    @property
    def size(self) -> int:
        """Size of the weights in bytes."""
        return self._require().size

    @property
    def n_ctx_train(self) -> int:
        """Context length the model was trained with."""
        return self._require().n_ctx_train

    @property
    def n_embd(self) -> int:
        """Embedding width."""
        return self._require().n_embd

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""
        return self._require().n_vocab

    @property
    def n_layer(self) -> int:
        """Number of trunk layers (blocks); MTP layers are counted in n_layer_nextn."""
        return self._require().n_layer

    @property
    def n_layer_nextn(self) -> int:
        """Number of Multi-Token-Prediction (NextN) layers in the file."""
        return self._require().n_layer_nextn

    @property
    def has_mtp(self) -> bool:
        """True when the file carries MTP layers (``<arch>.nextn_predict_layers`` > 0)."""
        return self.n_layer_nextn > 0

    @property
    def mtp_loaded(self) -> bool:
        """True when MTP layers were requested at load (``load_mtp=True``) and weights were loaded."""
        return self._require().mtp_loaded

    @property
    def architecture(self) -> str:
        """The GGUF ``general.architecture``, e.g. "llama" or "qwen35"."""
        return self._require().meta("general.architecture")

    @property
    def chat_template(self) -> str | None:
        """The chat template stored in the file, or None."""
        return self._require().chat_template

    @property
    def metadata(self) -> dict[str, str]:
        """All GGUF metadata as strings (llama.cpp's rendering; long arrays abbreviated)."""
        return dict(self._require().metadata())

    # -- tokenizer ------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Turn text into token ids.

        Args:
            text: the text.
            add_special: add BOS/EOS where the model asks for them.
            parse_special: turn special-token text such as "<|im_start|>" into its token.

        Returns:
            The token ids.

        Raises:
            ClosedError: the model is closed.
        """
        if not isinstance(text, str):
            raise InvalidOptionError(f"text must be a str, not {type(text).__name__}")
        return list(self._require().tokenize(text, add_special, parse_special))

    def detokenize(self, ids: Iterable[int], special: bool = False) -> str:
        """Turn token ids back into text (invalid UTF-8 becomes U+FFFD).

        Args:
            ids: token ids.
            special: render special/control tokens as their text.

        Returns:
            The text.

        Raises:
            InvalidOptionError: an id is out of range.
        """
        return self._require().detokenize(_ids(ids), special).decode("utf-8", errors="replace")

    def token_to_piece(self, id: int, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a multi-byte character).

        Raises:
            InvalidOptionError: the id is out of range.
        """
        return self._require().token_to_piece(_id(id), special)

    @property
    def bos(self) -> int | None:
        """Beginning-of-sequence token id, or None."""
        t = self._require().bos
        return None if t < 0 else t

    @property
    def eos(self) -> int | None:
        """End-of-sequence token id, or None."""
        t = self._require().eos
        return None if t < 0 else t

    def is_eog(self, id: int) -> bool:
        """True for tokens that end generation (EOS, EOT, ...)."""
        return self._require().is_eog(_id(id))

    def is_control(self, id: int) -> bool:
        """True for control tokens (``<|im_start|>``, BOS, ...): the ones a str prompt parses from
        their text and message text in a chat never becomes.

        Raises:
            InvalidOptionError: the id is out of range.
        """
        return bool(self._require().is_control(_id(id)))

    # -- chat -----------------------------------------------------------------------------------

    @overload
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, tokenize: Literal[False] = ...,
                            add_generation_prompt: bool = ..., enable_thinking: bool | None = ...,
                            chat_template: str | None = ..., **template_kwargs: Any) -> str: ...

    @overload
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, tokenize: Literal[True],
                            add_generation_prompt: bool = ..., enable_thinking: bool | None = ...,
                            chat_template: str | None = ..., **template_kwargs: Any) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """Render a conversation with the model's chat template (llama.cpp's jinja engine).

        With ``tokenize=True`` the result is the prompt's token ids, in which the template's markup
        becomes control tokens and the messages' text never does (a message holding
        ``<|im_start|>system`` stays text): the safe way to prompt with untrusted messages, the
        one ``chat_prompt`` (so ``stream(messages=...)`` and the server) goes through. The text
        form is for display, or for callers that want special-token text in it parsed (a str prompt
        parses special tokens).

        Args:
            messages: OpenAI-style messages, e.g. ``[{"role": "user", "content": "Hi"}]``.
            tokenize: return token ids (BOS added as the model wants) instead of text.
            add_generation_prompt: end with the assistant's turn header.
            enable_thinking: for templates with a thinking switch (Qwen3.x); None keeps the default.
            chat_template: a template to use instead of the one in the file.
            **template_kwargs: extra variables for the template (JSON-serializable values).

        Returns:
            The prompt text (special tokens as text), or its token ids with ``tokenize=True``.

        Raises:
            ChatTemplateError: the template failed for these messages.
            InvalidOptionError: messages or kwargs are not JSON-serializable.
        """
        native = self._require()
        render = Renderer(native, add_generation_prompt, enable_thinking, template_kwargs, chat_template)
        if tokenize:
            return chat_tokens(native, messages, render)
        return render(messages_json(messages))

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = "auto",
        parallel_tool_calls: bool = False,
        reasoning_format: str = "auto",
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> ChatPrompt:
        """A conversation, with tools, rendered for generation; pass it as a session's prompt.

        Rendering goes through llama.cpp's chat API (common/chat.h) and the safe token path of
        ``apply_chat_template(tokenize=True)``: message text never becomes control tokens (the tool
        definitions are the application's and count as template text). A session given the result
        samples with the template's tool-call grammar and streams the reply parsed (ChatPrompt).

        Args:
            messages: OpenAI-style messages; assistant messages may carry ``tool_calls`` and tool
                results come as ``{"role": "tool", "tool_call_id": ..., "content": ...}``.
            tools: OpenAI tool objects ``{"type": "function", "function": {"name", "description",
                "parameters"}}``, rendered in the template's own tool format (a template without
                one gets no tool grammar and its replies are parsed as plain content, ADR 0026).
            tool_choice: "auto" (the model may call a tool), "none" (tools shown, no call parsed),
                "required" (a call is forced by the grammar), or ``{"type": "function",
                "function": {"name": ...}}`` (that tool is required).
            parallel_tool_calls: allow several calls in one reply.
            reasoning_format: "auto"/"deepseek" put a thinking model's reasoning apart, "none" keeps
                it in the content (REASONING_FORMATS).
            add_generation_prompt, enable_thinking, chat_template, **template_kwargs: as in
                apply_chat_template.

        Returns:
            The ChatPrompt: its tokens, rendered text, output format, grammar and parser.

        Raises:
            InvalidOptionError: malformed messages or tools, an unknown tool_choice or reasoning
                format, tool_choice "required" without tools.
            ChatTemplateError: the template failed for these messages.
        """
        return build_chat_prompt(self._require(), messages, tools=tools, tool_choice=tool_choice,
                                 parallel_tool_calls=parallel_tool_calls, reasoning_format=reasoning_format,
                                 add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
                                 chat_template=chat_template, template_kwargs=template_kwargs)

    # -- embeddings ----------------------------------------------------------------------------

    def embed(
        self,
        texts: Sequence[str | Sequence[int]],
        *,
        pooling: str | None = None,
        normalize: bool = True,
        truncate: bool = False,
        n_ctx: int | None = None,
        n_threads: int | None = None,
    ) -> list[list[float]]:
        """One embedding vector per text, from an embedding context of this model's own (made on
        first use for these settings and kept; the inputs go in batches of whole texts, as
        llama.cpp's ``llama-embedding`` packs them).

        Args:
            texts: strings (tokenized with the model's special tokens added, e.g. BERT's [CLS] ...
                [SEP]) or token-id lists.
            pooling: "mean", "cls" or "last"; None: the model's own pooling type (an embedding GGUF
                names one), else "mean" (decoder models).
            normalize: L2-normalize each vector (llama-embedding's default); False: raw pooled values.
            truncate: cut a text longer than the context to fit (its last token kept when the
                tokenizer adds an end token); False: such a text is an error.
            n_ctx: the longest text in tokens, and a batch's size (default: the model's training
                context, at most 8192 for an embedding model and 2048 for a decoder, whose context
                holds a KV cache).
            n_threads: CPU threads (default: llama.cpp's, the number of math cores).

        Returns:
            ``len(texts)`` lists of ``n_embd`` floats.

        Raises:
            InvalidOptionError: texts is empty or not a list of texts, an option is invalid, a text
                has no tokens.
            ContextOverflowError: a text is longer than the context and truncate is False.
            UnsupportedModelError: the model gives no sentence embedding (an encoder-decoder model,
                or a reranker's pooling).
        """
        native = self._require()
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise InvalidOptionError("texts must be a list of strings (or token-id lists), not "
                                     f"{type(texts).__name__}")
        if not texts:
            raise InvalidOptionError("texts is empty: nothing to embed")
        _choice(*POOLING_TYPES, none_ok=True)("pooling", pooling)
        _bool("normalize", normalize)
        _bool("truncate", truncate)
        _int(8, 1 << 20, none_ok=True)("n_ctx", n_ctx)
        _int(1, 1024, none_ok=True)("n_threads", n_threads)
        # a decoder's context holds a KV cache: a smaller default than an embedding model's
        cap = 2048 if native.causal_attention else 8192
        ctx = n_ctx if n_ctx is not None else min(native.n_ctx_train or cap, cap)
        threads = n_threads if n_threads is not None else -1
        if pooling is None and native.pooling_type == 4:
            raise UnsupportedModelError("this model is a reranker (rank pooling): it gives scores, not "
                                        "sentence embeddings; choose pooling='mean', 'cls' or 'last'")
        kind = POOLING_TYPES[pooling] if pooling is not None else -1
        inputs: list[list[int]] = []
        for t in texts:
            if isinstance(t, str):
                ids = native.tokenize(t, True, False)
            elif isinstance(t, (list, tuple)):
                ids = _ids(t)
            else:
                raise InvalidOptionError(f"each text must be a str or a list of token ids, not "
                                         f"{type(t).__name__}")
            inputs.append(list(ids))
        embedder = self._embedder(native, ctx, kind, threads)
        limit = embedder.n_ctx
        if truncate:  # the first tokens, and the end token when the tokenizer adds one
            keep_end = native.add_eos_or_sep
            inputs = [(ids[:limit - 1] + ids[-1:] if keep_end else ids[:limit]) if len(ids) > limit else ids
                      for ids in inputs]
        return embedder.embed(inputs, normalize)

    def _embedder(self, native: _native.Model, n_ctx: int, pooling: int, n_threads: int) -> _native.Embedder:
        key = (n_ctx, pooling, n_threads)
        with self._embed_lock:
            e = self._embedders.get(key)
            if e is None:
                if pooling == -1 and native.pooling_type in (-1, 0):  # none named: decoder models
                    pooling = POOLING_TYPES["mean"]
                e = _native.Embedder(native, n_ctx, pooling, n_threads)
                self._embedders[key] = e
            return e


def _id(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidOptionError(f"token ids must be ints, not {type(v).__name__}")
    if v < 0 or v > 0x7FFFFFFF:
        raise InvalidOptionError(f"token id {v} is out of range")
    return v


def _ids(ids: Iterable[int]) -> list[int]:
    return [_id(i) for i in ids]
