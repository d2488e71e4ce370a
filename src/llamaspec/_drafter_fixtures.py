"""Tiny hand-built EAGLE-3, DFlash and DSpark drafters for the qwen35 test fixture.

The drafters are untrained GGUF files of a few MB that pair with a target written by
:func:`llamaspec.fixtures.write_qwen35_fixture` (same 260-token vocabulary, same ``n_embd``). They run
the real llama.cpp ``eagle3`` / ``dflash`` graphs and go through ``common_speculative`` unchanged, but
their weights are set so that what they draft is known in advance:

* **EAGLE-3** (``draft-eagle3``, arch ``eagle3``). ``target_layers = [0, 1, 2]``; the input of target
  layer 0 is the target's one-hot token embedding, and ``fc`` copies that block, so the fused feature
  ``g`` of a position is ``onehot(t)`` for the token ``t`` there. The decoder's attention output
  projection is zero, and its FFN is an exact lookup table (one hidden unit per token, ``gate`` and
  ``up`` read the same one-hot component, so only the unit of the token present fires) whose ``down``
  rows turn ``M*onehot(a)`` into ``M*onehot(next(a))``. The pre-norm output (which EAGLE-3 feeds back as
  the next step's ``g``) therefore walks the target's cycle, and the target's own head (shared through
  ``ctx_other``: the drafter has no ``token_embd`` / ``output``) maps it to ``next(next(a))``. Starting
  from ``g = onehot(prev)`` (the token before ``id_last``) the drafts are exactly the target's greedy
  continuation: 100 % acceptance. Tokens in ``wrong`` have their lookup row redirected one step further
  on the cycle (the draft becomes ``next^3`` instead of ``next^2``), the same convention as the MTP
  fixture, so ``wrong_fraction`` sets the acceptance (:meth:`DrafterInfo.simulate`).
* **DFlash** (``draft-dflash``, arch ``dflash``). A DFlash block is ``[id_last, <mask> x k]`` decoded in
  one non-causal pass; every mask position sees the same inputs except its RoPE position, so a
  one-layer hand-made drafter cannot tell its offset. The fixture makes every mask position attend
  (through unrotated Q/K dimensions, score ~32) only to the anchor ``id_last`` (the anchor's embedding
  carries a marker dimension that is the only non-zero key; target features injected into the KV cache
  have a zero key), copy its one-hot through V/O, and read it out through its own ``output`` head
  (``onehot(y) -> next(y)``). Every draft is ``next(id_last)``: the first is always right, the second
  always wrong, so each drafting step accepts exactly ``min(1, k)`` tokens (100 % with ``n_max = 1``).
  ``wrong`` tokens get an FFN lookup that moves the copied one-hot one step on, making even the first
  draft wrong. The drafter has its own ``token_embd`` and ``output`` (needs no ``ctx_other``).
* **DSpark** (``draft-dspark``, arch ``dflash`` plus ``markov_w1`` / ``markov_w2`` / ``conf_proj``). The
  DFlash backbone above plus a Markov head: ``markov_w1`` is the identity (rank 260) and ``markov_w2``
  adds a bias of 1000 to ``next(prev)``, so the in-graph argmax chain drafts ``next(id_last),
  next^2(id_last), ...`` -- the greedy continuation, 100 % acceptance (``block_size`` drafts per step at
  most). ``conf_proj`` is zero with bias 10 (confidence 0.99995), so any ``p_min < 0.9999`` keeps every
  draft. ``wrong`` tokens' Markov rows point one step further on.

Needs the optional dependencies ``gguf`` and ``numpy`` (``pip install llamaspec[fixtures]``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from llamaspec.fixtures import META_PREFIX, N_VOCAB, TOK_IM_START, FixtureInfo, simulate_greedy_speculation
from llamaspec.fixtures import _hidden_chain_drafts, _token_chain_drafts, _wrong_step
from llamaspec.fixtures import _add_tokenizer as _add_fixture_tokenizer

__all__ = [
    "DrafterInfo",
    "TOK_MASK",
    "write_eagle3_fixture",
    "write_dflash_fixture",
    "write_dspark_fixture",
]

TOK_MASK = TOK_IM_START  # DFlash/DSpark ``tokenizer.ggml.mask_token_id`` (must be a real vocab entry)

_DrafterKind = Literal["eagle3", "dflash", "dspark"]


@dataclass(frozen=True)
class DrafterInfo:
    """What a drafter writer produced: the path, the contract it was built for, and its known behaviour."""

    path: str
    kind: _DrafterKind                      # "eagle3" | "dflash" | "dspark" (the spec type is "draft-" + kind)
    arch: str                               # the GGUF general.architecture ("eagle3" or "dflash")
    n_embd: int                             # drafter n_embd (== the target's)
    target_n_embd: int
    target_layers: list[int]
    block_size: int                         # DFlash/DSpark dflash.block_size (0 for EAGLE-3)
    mask_token: int                         # DFlash/DSpark mask token id (-1 for EAGLE-3)
    next_map: list[int] = field(repr=False)  # the target's next(x), copied from its FixtureInfo
    wrong: list[int] = field(repr=False)    # tokens whose draft is redirected to a wrong token
    wrong_fraction: float = 0.0

    def max_draft(self, n_draft: int) -> int:
        """The draft length common_speculative actually uses for a requested ``n_max``.

        DFlash clamps ``n_max`` to ``block_size - 1``, DSpark (anchor-first) to ``block_size``.
        """
        if self.kind == "dflash":
            return min(n_draft, self.block_size - 1)
        if self.kind == "dspark":
            return min(n_draft, self.block_size)
        return n_draft

    def drafts(self, prev: int, last: int, k: int) -> list[int]:
        """The ``k`` tokens this drafter proposes when ``last`` (``id_last``) follows ``prev``.

        Args:
            prev: the committed token before ``last`` (only EAGLE-3 reads it: its ``g`` comes from
                the target's features at ``prev``'s position).
            last: ``id_last``, the newest target token (the drafting anchor).
            k: how many drafts (after any clamping).

        Returns:
            The draft tokens, in order.
        """
        nxt, wrong = self.next_map, set(self.wrong)
        if self.kind == "eagle3":
            return _hidden_chain_drafts(nxt, wrong, prev, k)
        if self.kind == "dflash":
            return [_wrong_step(nxt, wrong, last)] * k
        return _token_chain_drafts(nxt, wrong, last, k)

    def simulate(self, prompt: list[int], n_draft: int, max_tokens: int) -> tuple[int, int, int]:
        """Predict a speculative run with this drafter from its construction, without running it.

        Same conventions as :meth:`llamaspec.fixtures.FixtureInfo.simulate_mtp`: the first drafting
        step has ``prev, last = prompt[-2], prompt[-1]``, drafts are capped by the tokens still wanted
        and by :meth:`max_draft`, and the (greedy) target accepts the leading drafts that equal its
        continuation.

        Args:
            prompt: the prompt's token ids (at least 2).
            n_draft: the session's draft length (``n_max``).
            max_tokens: the call's max_tokens.

        Returns:
            (iterations, drafts_generated, drafts_accepted).

        Raises:
            ValueError: a prompt shorter than 2 tokens.
        """
        if len(prompt) < 2:
            raise ValueError("prompt needs at least 2 tokens")
        return simulate_greedy_speculation(self.next_map, prompt, self.max_draft(n_draft), max_tokens, self.drafts)


def _add_tokenizer(w: Any, *, mask: bool) -> None:
    """The target fixture's tokenizer (identical texts and ids), optionally with a mask token id."""
    _add_fixture_tokenizer(w)
    if mask:
        w.add_uint32("tokenizer.ggml.mask_token_id", TOK_MASK)


def _check_common(target: FixtureInfo, wrong_fraction: float, target_layers: list[int]) -> None:
    if not 0.0 <= wrong_fraction <= 1.0:
        raise ValueError("wrong_fraction must be within [0, 1]")
    if len(target.next_map) != N_VOCAB:
        raise ValueError("target is not a llamaspec qwen35 fixture (vocab size differs)")
    if target.spec.n_embd < N_VOCAB + 4:
        raise ValueError("target n_embd must be >= 264 (one-hot content plus marker dimensions)")
    if not target_layers or any(not 0 <= il < target.spec.n_trunk for il in target_layers):
        raise ValueError(f"target_layers must be non-empty ids in [0, {target.spec.n_trunk})")
    if target_layers[0] != 0:
        raise ValueError("target_layers[0] must be 0 (the fixture's fc reads the layer-0 input block)")


def _pick_wrong(target: FixtureInfo, wrong_fraction: float, seed: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    n_wrong = int(round(wrong_fraction * len(target.cycle)))
    return sorted(int(t) for t in rng.choice(target.cycle, size=n_wrong, replace=False)) if n_wrong else []


def _common_meta(w: Any, arch: str, target: FixtureInfo, wrong: list[int], wrong_fraction: float,
                 seed: int) -> None:
    w.add_name("llamaspec-drafter-fixture")
    w.add_context_length(target.spec.n_ctx_train)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_array(META_PREFIX + "next", list(target.next_map))
    w.add_array(META_PREFIX + "wrong", wrong if wrong else [-1])
    w.add_float32(META_PREFIX + "wrong_fraction", float(wrong_fraction))
    w.add_uint32(META_PREFIX + "seed", seed)


def _finish(w: Any) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_eagle3_fixture(
    path: str | os.PathLike[str],
    target: FixtureInfo,
    *,
    wrong_fraction: float = 0.0,
    target_layers: tuple[int, int, int] = (0, 1, 2),
    seed: int = 4321,
) -> DrafterInfo:
    """Write an EAGLE-3 drafter (arch ``eagle3``) for a qwen35 fixture; its drafts are known exactly.

    The drafter has one decoder layer, ``n_embd`` equal to the target's, no ``token_embd`` and no
    ``output`` (both are taken from the target through ``ctx_other``), F32 weights (~3 MB for TINY).

    Args:
        path: where to write the .gguf file.
        target: the FixtureInfo of the target it pairs with (only its sizes and next(x) map are used).
        wrong_fraction: fraction of cycle tokens whose draft chain is redirected one step too far
            (0.0 -> 100 % acceptance, 1.0 -> 0 %); see :meth:`DrafterInfo.simulate`.
        target_layers: the three target layers whose inputs are extracted (``eagle3.target_layers``);
            the first must be 0. Each must be < the target's layer count.
        seed: selects the wrong tokens and the (inert) random attention weights.

    Returns:
        A DrafterInfo describing the file.

    Raises:
        ValueError: an invalid argument, or a target that is not a llamaspec fixture.
    """
    import gguf
    import numpy as np

    layers = [int(x) for x in target_layers]
    if len(layers) != 3:
        raise ValueError("EAGLE-3 needs exactly 3 target layers")
    _check_common(target, wrong_fraction, layers)
    E = target.spec.n_embd
    nxt = target.next_map
    wrong = _pick_wrong(target, wrong_fraction, seed)
    rng = np.random.default_rng(seed + 1)
    n_head, n_head_kv, head_dim = 4, 2, 32
    n_ff = N_VOCAB
    eps = 1e-6

    arch = "eagle3"
    w = gguf.GGUFWriter(os.fspath(path), arch)
    _common_meta(w, arch, target, wrong, wrong_fraction, seed)
    w.add_embedding_length(E)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_array(f"{arch}.target_layers", layers)
    w.add_uint32(f"{arch}.target_hidden_size", E)
    _add_tokenizer(w, mask=False)

    def t(name: str, a: Any) -> None:
        w.add_tensor(name, np.ascontiguousarray(np.asarray(a, dtype=np.float32)))

    # fc: [3E] -> [E], copies the layer-0 input block (the target's one-hot embedding): g = onehot(t)
    fc = np.zeros((E, 3 * E), dtype=np.float32)
    fc[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    t("fc.weight", fc)
    t("output_norm.weight", np.ones(E))
    p = "blk.0."
    t(p + "attn_norm.weight", np.ones(E))
    t(p + "attn_norm_2.weight", np.ones(E))
    t(p + "ffn_norm.weight", np.ones(E))
    t(p + "attn_q.weight", rng.normal(0.0, 0.02, size=(n_head * head_dim, 2 * E)))
    t(p + "attn_k.weight", rng.normal(0.0, 0.02, size=(n_head_kv * head_dim, 2 * E)))
    t(p + "attn_v.weight", rng.normal(0.0, 0.02, size=(n_head_kv * head_dim, 2 * E)))
    t(p + "attn_output.weight", np.zeros((E, n_head * head_dim)))  # attention never moves the state

    # FFN lookup: for g = M*onehot(a) (M = 1 from fc, kept by every step), ffn_norm gives u_a = u,
    # hidden_a = silu(u) * u and every other unit is exactly 0; down column a adds
    # M*(onehot(row(a)) - onehot(a)), so the pre-norm output is M*onehot(row(a)).
    u = 1.0 / np.sqrt(1.0 / E + eps)
    h = u / (1.0 + np.exp(-u)) * u
    gate = np.zeros((n_ff, E), dtype=np.float32)
    gate[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    down = np.zeros((E, n_ff), dtype=np.float64)
    wrong_set = set(wrong)
    for a in range(N_VOCAB):
        row = nxt[nxt[a]] if a in wrong_set else nxt[a]
        down[row, a] += 1.0 / h
        down[a, a] -= 1.0 / h
    t(p + "ffn_gate.weight", gate)
    t(p + "ffn_up.weight", gate)
    t(p + "ffn_down.weight", down)

    _finish(w)
    return DrafterInfo(os.fspath(path), "eagle3", arch, E, E, layers, 0, -1, list(nxt), wrong, wrong_fraction)


# DFlash layout: content dims [0, 260) carry one-hots; two marker dims tell the anchor from masks
_DIM_ANCHOR = -2  # offset from n_embd: set in the embedding of every non-mask token
_DIM_MASK = -1    # set in the mask token's embedding


def _write_dflash(
    path: str | os.PathLike[str],
    target: FixtureInfo,
    kind: Literal["dflash", "dspark"],
    wrong_fraction: float,
    target_layers: list[int],
    block_size: int,
    seed: int,
) -> DrafterInfo:
    import gguf
    import numpy as np

    _check_common(target, wrong_fraction, target_layers)
    if not 2 <= block_size <= 64:
        raise ValueError("block_size must be within [2, 64]")
    E = target.spec.n_embd
    nxt = target.next_map
    wrong = _pick_wrong(target, wrong_fraction, seed)
    wrong_set = set(wrong)
    head_dim = 64
    if E % head_dim != 0:
        raise ValueError("target n_embd must be a multiple of 64 for the DFlash fixture")
    n_head = E // head_dim
    n_rot = 32          # rotated dims [0, 32) of each head; Q/K live in the unrotated dim 63
    n_ff = N_VOCAB
    n_tl = len(target_layers)
    eps = 1e-6
    d_anchor, d_mask = E + _DIM_ANCHOR, E + _DIM_MASK

    arch = "dflash"
    w = gguf.GGUFWriter(os.fspath(path), arch)
    _common_meta(w, arch, target, wrong, wrong_fraction, seed)
    w.add_embedding_length(E)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(n_rot)
    w.add_array(f"{arch}.target_layers", [int(x) for x in target_layers])
    w.add_uint32(f"{arch}.block_size", block_size)
    if kind == "dspark":
        w.add_bool(f"{arch}.sample_from_anchor", True)
        w.add_bool(f"{arch}.has_confidence_head", True)
    _add_tokenizer(w, mask=True)

    def t(name: str, a: Any) -> None:
        w.add_tensor(name, np.ascontiguousarray(np.asarray(a, dtype=np.float32)))

    # own embeddings: onehot(x) + anchor marker; the mask token carries only the mask marker
    emb = np.zeros((N_VOCAB, E), dtype=np.float32)
    emb[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    emb[:, d_anchor] = 1.0
    emb[TOK_MASK, :] = 0.0
    emb[TOK_MASK, d_mask] = 1.0
    t("token_embd.weight", emb)
    # own head, like the target's: content y -> logit next(y); marker dims read nothing
    head = np.zeros((N_VOCAB, E), dtype=np.float32)
    for x in range(N_VOCAB):
        head[nxt[x], x] = 1.0
    t("output.weight", head)
    t("output_norm.weight", np.ones(E))
    # fc copies the layer-0 input block (one-hot of the target token); no marker -> zero key
    fc = np.zeros((E, n_tl * E), dtype=np.float32)
    fc[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    t("fc.weight", fc)
    t("enc.output_norm.weight", np.ones(E))

    p = "blk.0."
    t(p + "attn_norm.weight", np.ones(E))
    t(p + "ffn_norm.weight", np.ones(E))
    wq = np.zeros((n_head * head_dim, E), dtype=np.float32)
    wk = np.zeros((n_head * head_dim, E), dtype=np.float32)
    wv = np.zeros((n_head * head_dim, E), dtype=np.float32)
    wo = np.zeros((E, n_head * head_dim), dtype=np.float32)
    for hh in range(n_head):
        wq[hh * head_dim + head_dim - 1, d_mask] = 1.0     # masks query ...
        wk[hh * head_dim + head_dim - 1, d_anchor] = 1.0   # ... the anchor's key only
        for j in range(head_dim):
            c = hh * head_dim + j
            if c < N_VOCAB:
                wv[hh * head_dim + j, c] = 1.0             # V/O copy the anchor's one-hot
                wo[c, hh * head_dim + j] = 1.0
    t(p + "attn_q.weight", wq)
    t(p + "attn_k.weight", wk)
    t(p + "attn_v.weight", wv)
    t(p + "attn_output.weight", wo)
    # after q/k RMS norm the single non-zero dim is 8; weight 2 -> score 16 * 16 / 8 = 32
    qk_norm = np.ones(head_dim, dtype=np.float32)
    qk_norm[head_dim - 1] = 2.0
    t(p + "attn_q_norm.weight", qk_norm)
    t(p + "attn_k_norm.weight", qk_norm)

    # FFN lookup, only for the wrong tokens: moves the copied one-hot of x to next(x) (10x larger)
    gate = np.zeros((n_ff, E), dtype=np.float32)
    gate[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
    down = np.zeros((E, n_ff), dtype=np.float32)
    for x in wrong_set:
        down[nxt[x], x] = 1.0
    t(p + "ffn_gate.weight", gate)
    t(p + "ffn_up.weight", gate)
    t(p + "ffn_down.weight", down)

    if kind == "dspark":
        # Markov head: bias(prev) = w2^T w1[prev] = 1000 * onehot(next(prev)) (next^2 for wrong prev)
        w1 = np.zeros((N_VOCAB, N_VOCAB), dtype=np.float32)   # ggml {R, n_vocab}: row per token
        w1[np.arange(N_VOCAB), np.arange(N_VOCAB)] = 1.0
        w2 = np.zeros((N_VOCAB, N_VOCAB), dtype=np.float32)   # ggml {R, n_vocab}: row per output token
        for x in range(N_VOCAB):
            y = nxt[nxt[x]] if x in wrong_set else nxt[x]
            w2[y, x] = 1000.0
        t("markov_w1.weight", w1)
        t("markov_w2.weight", w2)
        t("conf_proj.weight", np.zeros((1, E + N_VOCAB)))
        t("conf_proj.bias", np.array([10.0]))

    _finish(w)
    return DrafterInfo(os.fspath(path), kind, arch, E, E, [int(x) for x in target_layers], block_size, TOK_MASK,
                       list(nxt), wrong, wrong_fraction)


def write_dflash_fixture(
    path: str | os.PathLike[str],
    target: FixtureInfo,
    *,
    wrong_fraction: float = 0.0,
    target_layers: tuple[int, ...] = (0, 1, 2),
    block_size: int = 8,
    seed: int = 4322,
) -> DrafterInfo:
    """Write a DFlash drafter (arch ``dflash``) for a qwen35 fixture; every draft is ``next(id_last)``.

    So each drafting step accepts exactly one token (``min(1, k)``; 100 % with ``n_max = 1``), and
    none when ``id_last`` is a wrong token. Own ``token_embd`` and ``output``, F32 (~4.5 MB for TINY).

    Args:
        path: where to write the .gguf file.
        target: the FixtureInfo of the target it pairs with.
        wrong_fraction: fraction of cycle tokens whose draft is redirected to a wrong token.
        target_layers: target layers whose inputs are injected (``dflash.target_layers``); the first
            must be 0, each < the target's layer count.
        block_size: ``dflash.block_size`` (drafts per step are clamped to ``block_size - 1``).
        seed: selects the wrong tokens.

    Returns:
        A DrafterInfo describing the file.

    Raises:
        ValueError: an invalid argument, or a target that is not a llamaspec fixture.
    """
    return _write_dflash(path, target, "dflash", wrong_fraction, list(target_layers), block_size, seed)


def write_dspark_fixture(
    path: str | os.PathLike[str],
    target: FixtureInfo,
    *,
    wrong_fraction: float = 0.0,
    target_layers: tuple[int, ...] = (0, 1, 2),
    block_size: int = 8,
    seed: int = 4323,
) -> DrafterInfo:
    """Write a DSpark drafter (arch ``dflash`` with a Markov and a confidence head); 100 % acceptance.

    The Markov head drafts the target's greedy continuation exactly (``block_size`` drafts per step at
    most); ``wrong_fraction`` redirects the chain at the chosen tokens. F32 (~5 MB for TINY).

    Args:
        path: where to write the .gguf file.
        target: the FixtureInfo of the target it pairs with.
        wrong_fraction: fraction of cycle tokens whose Markov successor is one step too far.
        target_layers: target layers whose inputs are injected; the first must be 0.
        block_size: ``dflash.block_size`` (required by the DSpark graph; drafts are clamped to it).
        seed: selects the wrong tokens.

    Returns:
        A DrafterInfo describing the file.

    Raises:
        ValueError: an invalid argument, or a target that is not a llamaspec fixture.
    """
    return _write_dflash(path, target, "dspark", wrong_fraction, list(target_layers), block_size, seed)
