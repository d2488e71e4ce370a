"""Tiny GGUF models whose greedy output and drafting acceptance are known by construction: qwen35
targets (optionally with an MTP head), a llama draft model, and EAGLE-3 / DFlash / DSpark drafter heads.

No MTP model small enough for tests can be downloaded, so we write our own (the design is in
docs/fixtures.md). The weights are not trained: the real llama.cpp qwen35 graph (Gated DeltaNet
recurrent layers, gated attention, the MTP block) runs on them in full, but they are built so that

* the residual stream carries onehot(x): token embeddings are one-hot and every layer's output
  projection is tiny, so each layer computes at full cost without moving the hidden state;
* the output head maps token x to ``next(x)``, a fixed random cycle over the 95 printable ASCII
  tokens (other tokens lead into the cycle): greedy output is known in advance;
* the MTP block's ``eh_proj`` reads the HIDDEN half of its input (onehot of the previous token) and
  maps it to the row whose head output is the correct next-next token, so a drafter that feeds the
  wrong hidden row gets ~0% acceptance; redirecting a fraction ``mtp_wrong_fraction`` of the cycle
  to wrong tokens sets the acceptance.

Needs the optional dependencies ``gguf`` and ``numpy`` (``pip install llamaspec[fixtures]``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Literal

__all__ = [
    "FixtureSpec", "FixtureInfo", "DraftFixtureInfo", "DrafterInfo", "TINY", "SPEED", "write_qwen35_fixture",
    "write_draft_fixture", "write_eagle3_fixture", "write_dflash_fixture", "write_dspark_fixture",
    "fixture_next_map", "simulate_greedy_speculation",
]

N_BYTES = 256
TOK_DOUBLE_SPACE = 256
TOK_EOS = 257  # <|endoftext|>, also BOS and PAD
TOK_IM_START = 258
TOK_IM_END = 259
N_VOCAB = 260
PRINTABLE = list(range(32, 127))  # the 95 printable ASCII bytes

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

META_PREFIX = "llamaspec.fixture."


@dataclass(frozen=True)
class FixtureSpec:
    """Sizes of a fixture. ``TINY`` is for unit tests, ``SPEED`` for benchmarks."""

    n_embd: int
    n_trunk: int          # trunk layers; every 4th is full attention, the rest recurrent
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ssm_state: int
    ssm_k_heads: int
    ssm_v_heads: int
    n_ctx_train: int = 4096


TINY = FixtureSpec(n_embd=320, n_trunk=4, n_ff=128, n_head=4, n_head_kv=2, head_dim=32,
                   ssm_state=32, ssm_k_heads=2, ssm_v_heads=4)
SPEED = FixtureSpec(n_embd=512, n_trunk=16, n_ff=1024, n_head=8, n_head_kv=4, head_dim=64,
                    ssm_state=64, ssm_k_heads=4, ssm_v_heads=8)


@dataclass(frozen=True)
class FixtureInfo:
    """What was written: the path and the facts tests check against."""

    path: str
    spec: FixtureSpec
    mtp: bool
    quant: str
    cycle: list[int]                       # the printable cycle, in order
    next_map: list[int] = field(repr=False)  # next(x) for every token id
    mtp_wrong: list[int] = field(repr=False)  # cycle tokens whose MTP draft is redirected
    mtp_wrong_fraction: float = 0.0

    def simulate_mtp(self, prompt: list[int], n_draft: int, max_tokens: int) -> tuple[int, int, int]:
        """Predict an MTP run on this fixture from its construction, without running the model.

        Replays the drafting loop: the head reads onehot(previous token) and drafts by ``eh_proj``'s
        mapping (redirected one step further for the "wrong" tokens); the target accepts the leading
        drafts that equal the greedy continuation.

        Args:
            prompt: the prompt's token ids (at least 2).
            n_draft: the session's draft length.
            max_tokens: the call's max_tokens (drafts are capped by the tokens still wanted).

        Returns:
            (iterations, drafts_generated, drafts_accepted).
        """
        if not self.mtp:
            raise ValueError("this fixture has no MTP head")
        wrong = set(self.mtp_wrong)
        nxt = self.next_map
        return simulate_greedy_speculation(nxt, prompt, n_draft, max_tokens,
                                           lambda prev, last, k: _hidden_chain_drafts(nxt, wrong, prev, k))

    def greedy(self, last_token: int, n: int) -> list[int]:
        """The greedy continuation of a prompt that ends with ``last_token``."""
        out, x = [], last_token
        for _ in range(n):
            x = self.next_map[x]
            out.append(x)
        return out


def _wrong_step(next_map: list[int], wrong: set[int], x: int) -> int:
    """What a fixture drafter maps x to: next(x), or next(next(x)) for its "wrong" tokens."""
    return next_map[next_map[x]] if x in wrong else next_map[x]


def _hidden_chain_drafts(next_map: list[int], wrong: set[int], prev: int, k: int) -> list[int]:
    """k drafts of a head that reads the hidden state of the token before the newest one (the MTP
    and EAGLE-3 fixtures): the hidden state walks the (redirected) cycle, the head emits next() of it."""
    out, h = [], prev
    for _ in range(k):
        h = _wrong_step(next_map, wrong, h)
        out.append(next_map[h])
    return out


def _token_chain_drafts(next_map: list[int], wrong: set[int], last: int, k: int) -> list[int]:
    """k drafts of a drafter that chains its own tokens from the newest one (the draft-model and
    DSpark fixtures)."""
    out, x = [], last
    for _ in range(k):
        x = _wrong_step(next_map, wrong, x)
        out.append(x)
    return out


def simulate_greedy_speculation(next_map: list[int], prompt: list[int], n_draft: int, max_tokens: int,
                                drafts: Callable[[int, int, int], list[int]]) -> tuple[int, int, int]:
    """Replay a greedy speculative run on a fixture target, without running a model.

    Each iteration drafts ``k = min(n_draft, tokens still wanted - 1)`` tokens with
    ``drafts(prev, last, k)`` (``last`` is the newest token, ``prev`` the one before it; a drafter may
    clamp k further); the target accepts the leading drafts that equal its greedy continuation
    (``next_map``) and adds one token of its own.

    Args:
        next_map: the target's next(x).
        prompt: the prompt's token ids (at least 1; ``prev`` is -1 for a one-token prompt).
        n_draft: the session's draft length.
        max_tokens: the call's max_tokens.
        drafts: the drafter's construction.

    Returns:
        (iterations, drafts_generated, drafts_accepted).
    """
    nxt = next_map
    prev, last = (prompt[-2] if len(prompt) > 1 else -1), prompt[-1]
    emitted = iterations = drafted = accepted = 0
    while emitted < max_tokens:
        proposed = drafts(prev, last, max(0, min(n_draft, max_tokens - emitted - 1)))
        a, cur = 0, last
        for d in proposed:
            if d != nxt[cur]:
                break
            a, cur = a + 1, d
        iterations += 1
        drafted += len(proposed)
        accepted += a
        out = [last]
        for _ in range(a + 1):
            out.append(nxt[out[-1]])
        emitted += a + 1
        prev, last = out[-2], out[-1]
    return iterations, drafted, accepted


def _gpt2_byte_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _add_tokenizer(w: Any) -> None:
    """The fixtures' tokenizer: 256 byte tokens (GPT-2 byte-to-unicode), one merge, three control tokens."""
    import gguf

    b2u = _gpt2_byte_to_unicode()
    tokens = [b2u[b] for b in range(N_BYTES)] + [b2u[32] * 2, "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * (N_BYTES + 1) + [gguf.TokenType.CONTROL] * 3
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{b2u[32]} {b2u[32]}"])
    w.add_bos_token_id(TOK_EOS)
    w.add_eos_token_id(TOK_EOS)
    w.add_pad_token_id(TOK_EOS)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)


def fixture_next_map(seed: int) -> tuple[list[int], list[int]]:
    """The cycle over printable tokens and next(x) for every token, from a seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cycle = [int(t) for t in rng.permutation(PRINTABLE)]
    nxt = [0] * N_VOCAB
    for i, t in enumerate(cycle):
        nxt[t] = cycle[(i + 1) % len(cycle)]
    others = [t for t in range(N_VOCAB) if t not in set(PRINTABLE)]
    for j, t in enumerate(others):
        nxt[t] = cycle[(j * 7) % len(cycle)]  # spread the rest over the cycle
    return cycle, nxt


def write_qwen35_fixture(
    path: str | os.PathLike[str],
    *,
    spec: FixtureSpec = TINY,
    mtp: bool = True,
    mtp_wrong_fraction: float = 0.0,
    quant: Literal["f16", "q8_0"] = "f16",
    seed: int = 1234,
) -> FixtureInfo:
    """Write a qwen35 GGUF with known greedy output (and, with ``mtp``, an MTP head of known acceptance).

    Args:
        path: where to write the .gguf file.
        spec: sizes (TINY: 3.7 MB, for tests; SPEED: 86 MB, for benchmarks).
        mtp: add the MTP block and ``qwen35.nextn_predict_layers = 1``; False writes the no-MTP twin
            (same trunk, same output).
        mtp_wrong_fraction: fraction of cycle tokens whose MTP draft is redirected to a wrong token
            (0.0 -> 100% acceptance, 1.0 -> 0%).
        quant: "f16" or "q8_0" for the 2-D weights (1-D norms stay F32).
        seed: selects the cycle and the random weights.

    Returns:
        A FixtureInfo with the cycle and next(x) map (also stored in the file's metadata).

    Raises:
        ValueError: an invalid argument.
    """
    import gguf
    import numpy as np

    if not 0.0 <= mtp_wrong_fraction <= 1.0:
        raise ValueError("mtp_wrong_fraction must be within [0, 1]")
    if quant not in ("f16", "q8_0"):
        raise ValueError("quant must be 'f16' or 'q8_0'")
    s = spec
    E = s.n_embd
    if E < N_VOCAB:
        raise ValueError("n_embd must be >= 260 (one-hot embeddings)")
    rng = np.random.default_rng(seed + 1)
    cycle, nxt = fixture_next_map(seed)
    n_wrong = int(round(mtp_wrong_fraction * len(cycle)))
    wrong = sorted(int(t) for t in rng.choice(cycle, size=n_wrong, replace=False)) if n_wrong else []

    n_blocks = s.n_trunk + (1 if mtp else 0)
    recurrent = [(i + 1) % 4 != 0 for i in range(s.n_trunk)] + ([False] if mtp else [])
    if not any(recurrent):
        raise ValueError("qwen35 needs at least one recurrent trunk layer")
    n_rot = max(4, s.head_dim // 4)
    half = n_rot // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3, 0]

    w = gguf.GGUFWriter(os.fspath(path), "qwen35")
    arch = "qwen35"
    w.add_name("llamaspec-fixture")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(E)
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(sections)
    w.add_ssm_conv_kernel(4)
    w.add_ssm_state_size(s.ssm_state)
    w.add_ssm_group_count(s.ssm_k_heads)
    w.add_ssm_time_step_rank(s.ssm_v_heads)
    w.add_ssm_inner_size(s.ssm_state * s.ssm_v_heads)
    w.add_full_attention_interval(4)
    w.add_array(f"{arch}.attention.recurrent_layers", recurrent)
    if mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)

    _add_tokenizer(w)

    # what tests check against
    w.add_array(META_PREFIX + "cycle", cycle)
    w.add_array(META_PREFIX + "next", nxt)
    w.add_array(META_PREFIX + "mtp_wrong", wrong if wrong else [-1])
    w.add_float32(META_PREFIX + "mtp_wrong_fraction", float(mtp_wrong_fraction))
    w.add_uint32(META_PREFIX + "seed", seed)

    qtype = gguf.GGMLQuantizationType.Q8_0 if quant == "q8_0" else gguf.GGMLQuantizationType.F16

    def mat(name: str, ne0: int, ne1: int, data: Any) -> None:
        a = np.asarray(data, dtype=np.float32).reshape(ne1, ne0)  # numpy shape = reversed ggml shape
        if qtype == gguf.GGMLQuantizationType.Q8_0 and ne0 % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a.astype(np.float16))

    def vec(name: str, data: Any) -> None:
        w.add_tensor(name, np.asarray(data, dtype=np.float32))

    def rand(ne0: int, ne1: int, std: float) -> Any:
        return rng.normal(0.0, std, size=(ne1, ne0)).astype(np.float32)

    ones = np.ones(E, dtype=np.float32)
    emb = np.zeros((N_VOCAB, E), dtype=np.float32)
    emb[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    mat("token_embd.weight", E, N_VOCAB, emb)
    head = np.zeros((N_VOCAB, E), dtype=np.float32)
    for x in range(N_VOCAB):
        head[nxt[x], x] = 1.0
    mat("output.weight", E, N_VOCAB, head)
    vec("output_norm.weight", ones)

    tiny = 1e-4
    kdim = s.ssm_state * s.ssm_k_heads
    vdim = s.ssm_state * s.ssm_v_heads
    conv = 2 * kdim + vdim
    for il in range(n_blocks):
        p = f"blk.{il}."
        is_mtp = mtp and il == n_blocks - 1
        vec(p + "attn_norm.weight", ones)
        vec(p + "post_attention_norm.weight", ones)
        mat(p + "ffn_gate.weight", E, s.n_ff, rand(E, s.n_ff, 0.02))
        mat(p + "ffn_up.weight", E, s.n_ff, rand(E, s.n_ff, 0.02))
        mat(p + "ffn_down.weight", s.n_ff, E, np.zeros((E, s.n_ff)) if is_mtp else rand(s.n_ff, E, tiny))
        if recurrent[il]:
            mat(p + "attn_qkv.weight", E, conv, rand(E, conv, 0.02))
            mat(p + "attn_gate.weight", E, vdim, rand(E, vdim, 0.02))
            w.add_tensor(p + "ssm_conv1d.weight", rand(4, conv, 0.2))  # ggml's ssm_conv needs F32
            vec(p + "ssm_dt.bias", rng.normal(0.0, 0.1, size=s.ssm_v_heads))
            vec(p + "ssm_a", -np.exp(rng.normal(0.0, 0.5, size=s.ssm_v_heads)))
            mat(p + "ssm_beta.weight", E, s.ssm_v_heads, rand(E, s.ssm_v_heads, 0.02))
            mat(p + "ssm_alpha.weight", E, s.ssm_v_heads, rand(E, s.ssm_v_heads, 0.02))
            vec(p + "ssm_norm.weight", np.ones(s.ssm_state))
            mat(p + "ssm_out.weight", vdim, E, rand(vdim, E, tiny))
        else:
            qd = s.head_dim * s.n_head
            kvd = s.head_dim * s.n_head_kv
            mat(p + "attn_q.weight", E, qd * 2, rand(E, qd * 2, 0.02))
            mat(p + "attn_k.weight", E, kvd, rand(E, kvd, 0.02))
            mat(p + "attn_v.weight", E, kvd, rand(E, kvd, 0.02))
            vec(p + "attn_q_norm.weight", np.ones(s.head_dim))
            vec(p + "attn_k_norm.weight", np.ones(s.head_dim))
            mat(p + "attn_output.weight", qd, E, np.zeros((E, qd)) if is_mtp else rand(qd, E, tiny))
        if is_mtp:
            # eh_proj: out[j] = sum_i W[j, i] * concat[i], concat = [enorm(emb(id_last)), hnorm(h_prev)].
            # The hidden half onehot(x_prev) maps to onehot(next(x_prev)) = the row whose head output
            # is next(next(x_prev)), the correct draft; "wrong" tokens map one step further on.
            eh = np.zeros((E, 2 * E), dtype=np.float32)
            wrong_set = set(wrong)
            for x in range(N_VOCAB):
                target = nxt[x]
                if x in wrong_set:
                    target = nxt[nxt[x]]  # the draft becomes next^3(x): never the next token
                eh[target, E + x] = 1.0
            mat(p + "nextn.eh_proj.weight", 2 * E, E, eh)
            vec(p + "nextn.enorm.weight", ones)
            vec(p + "nextn.hnorm.weight", ones)
            vec(p + "nextn.shared_head_norm.weight", ones)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return FixtureInfo(os.fspath(path), spec, mtp, quant, cycle, nxt, wrong, mtp_wrong_fraction)


@dataclass(frozen=True)
class DraftFixtureInfo:
    """A draft model for a qwen35 fixture (method "draft"): what was written and its known acceptance."""

    path: str
    target: FixtureInfo
    wrong: list[int] = field(repr=False)  # cycle tokens after which the draft proposes a wrong token
    wrong_fraction: float = 0.0

    def simulate(self, prompt: list[int], n_draft: int, max_tokens: int) -> tuple[int, int, int]:
        """Predict a draft-simple run (greedy, p_min 0) on the target from the construction.

        The draft's head maps x to next(x), except for the "wrong" tokens, whose draft is
        next(next(x)); the target accepts the leading drafts that equal its greedy continuation.

        Args:
            prompt: the prompt's token ids (at least 1).
            n_draft: the session's draft length.
            max_tokens: the call's max_tokens (drafts are capped by the tokens still wanted).

        Returns:
            (iterations, drafts_generated, drafts_accepted).
        """
        wrong = set(self.wrong)
        nxt = self.target.next_map
        return simulate_greedy_speculation(nxt, prompt, n_draft, max_tokens,
                                           lambda prev, last, k: _token_chain_drafts(nxt, wrong, last, k))


def write_draft_fixture(
    path: str | os.PathLike[str],
    target: FixtureInfo,
    *,
    wrong_fraction: float = 0.0,
    n_layer: int = 2,
    seed: int = 99,
) -> DraftFixtureInfo:
    """Write a tiny "llama" (pure transformer) draft model for a qwen35 fixture: the same
    vocabulary, a head that proposes the target's greedy continuation except after a chosen fraction
    of the cycle's tokens.

    Args:
        path: where to write the .gguf file.
        target: the fixture the draft drafts for (its next map defines the right proposals).
        wrong_fraction: fraction of cycle tokens after which the draft proposes a wrong token
            (0.0 -> 100% acceptance, 1.0 -> 0%).
        n_layer: transformer blocks (each runs in full, without moving the one-hot residual).
        seed: selects the wrong tokens and the random weights.

    Returns:
        A DraftFixtureInfo with the wrong tokens and ``simulate()``.

    Raises:
        ValueError: an invalid argument.
    """
    import gguf
    import numpy as np

    if not 0.0 <= wrong_fraction <= 1.0:
        raise ValueError("wrong_fraction must be within [0, 1]")
    if n_layer < 1:
        raise ValueError("n_layer must be >= 1")
    E, n_head, n_head_kv, n_ff = 320, 4, 2, 128
    head_dim = E // n_head
    rng = np.random.default_rng(seed)
    cycle, nxt = target.cycle, target.next_map
    n_wrong = int(round(wrong_fraction * len(cycle)))
    wrong = sorted(int(t) for t in rng.choice(cycle, size=n_wrong, replace=False)) if n_wrong else []

    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_name("llamaspec-draft-fixture")
    w.add_context_length(target.spec.n_ctx_train)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    _add_tokenizer(w)
    w.add_array(META_PREFIX + "wrong", wrong if wrong else [-1])
    w.add_float32(META_PREFIX + "wrong_fraction", float(wrong_fraction))

    def mat(name: str, ne0: int, ne1: int, data: Any) -> None:
        w.add_tensor(name, np.asarray(data, dtype=np.float32).reshape(ne1, ne0).astype(np.float16))

    def vec(name: str, data: Any) -> None:
        w.add_tensor(name, np.asarray(data, dtype=np.float32))

    def rand(ne0: int, ne1: int, std: float) -> Any:
        return rng.normal(0.0, std, size=(ne1, ne0))

    emb = np.zeros((N_VOCAB, E), dtype=np.float32)
    emb[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    mat("token_embd.weight", E, N_VOCAB, emb)
    wrong_set = set(wrong)
    head = np.zeros((N_VOCAB, E), dtype=np.float32)
    for x in range(N_VOCAB):
        head[nxt[nxt[x]] if x in wrong_set else nxt[x], x] = 1.0
    mat("output.weight", E, N_VOCAB, head)
    vec("output_norm.weight", np.ones(E))
    tiny = 1e-4
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", np.ones(E))
        vec(p + "ffn_norm.weight", np.ones(E))
        mat(p + "attn_q.weight", E, E, rand(E, E, 0.02))
        mat(p + "attn_k.weight", E, head_dim * n_head_kv, rand(E, head_dim * n_head_kv, 0.02))
        mat(p + "attn_v.weight", E, head_dim * n_head_kv, rand(E, head_dim * n_head_kv, 0.02))
        mat(p + "attn_output.weight", E, E, rand(E, E, tiny))
        mat(p + "ffn_gate.weight", E, n_ff, rand(E, n_ff, 0.02))
        mat(p + "ffn_up.weight", E, n_ff, rand(E, n_ff, 0.02))
        mat(p + "ffn_down.weight", n_ff, E, rand(n_ff, E, tiny))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return DraftFixtureInfo(os.fspath(path), target, wrong, wrong_fraction)


# the drafter-head fixtures (EAGLE-3, DFlash, DSpark) live in their own module; they build on the above
from ._drafter_fixtures import (  # noqa: E402
    DrafterInfo,
    write_dflash_fixture,
    write_dspark_fixture,
    write_eagle3_fixture,
)
