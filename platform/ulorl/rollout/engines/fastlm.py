"""A functional forward pass of Llama-family decoders (Qwen3, Qwen2, Llama, Mistral) for rollouts.

``FastCausalLM`` reads the weights of a transformers ``*ForCausalLM`` once, packs q/k/v and
gate/up into single matrices, and runs two primitives with no Python module dispatch:

- ``prefill(ids, valid)``: a left-padded batch ``[n, T]`` -> its keys/values ``[L, 2, n, kvh, T, hd]``
  and the logits of the last position ``[n, V]``;
- ``decode(tok, pos, buckets, col_offset)``: one token per row, keys/values written in place
  into preallocated per-bucket caches, ragged attention (each bucket attends only over its own
  width) -> logits ``[B, V]``.

Math is the model's own (RMSNorm, q/k-norm when present, the model's rotary tables, GQA,
SiLU-gated MLP), so log-probs equal a full ``model(...)`` forward within float tolerance;
``verify`` checks this numerically and the engine falls back to the model's forward if not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


@dataclass
class _Layer:
    # RMSNorm weights are folded into the next matrix: rms(x) * g @ W.T == rms(x) @ (W * g).T
    wqkv: torch.Tensor
    bqkv: Optional[torch.Tensor]
    qkn: Optional[torch.Tensor]          # [nh + kvh, hd] q-norm / k-norm weights, or None
    wo: torch.Tensor
    bo: Optional[torch.Tensor]
    wgu: torch.Tensor
    bgu: Optional[torch.Tensor]
    wd: torch.Tensor
    bd: Optional[torch.Tensor]


@dataclass
class Bucket:
    """Rows ``[start, start + num_rows)`` of the decode batch with a shared cache width.

    ``kv``: ``[L, 2, num_rows, kvh, W, hd]``; a row with context length c holds it right-aligned
    in columns ``[context_width - c, context_width)`` and decoded token j (j >= 1) at column
    ``context_width + j - 1``. ``mask``: ``[num_rows, 1, 1, W]`` bool (True = attend) or None when
    every row starts at column 0.
    """

    kv: torch.Tensor
    mask: Optional[torch.Tensor]
    context_width: int
    start: int
    num_rows: int


def unsupported_reason(model) -> Optional[str]:
    """Why ``FastCausalLM`` cannot run ``model`` (None when it can)."""
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model_type {mt!r} not in {SUPPORTED_MODEL_TYPES}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "no .model.layers / .lm_head"
    hidden_act = getattr(cfg, "hidden_act", "silu")
    if hidden_act != "silu":
        return f"hidden_act {hidden_act!r}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "sliding-window layers"
    if mt == "mistral" and getattr(cfg, "sliding_window", None):
        return "mistral sliding window"
    if not hasattr(inner, "rotary_emb"):
        return "no rotary_emb module"
    return None


class FastCausalLM:
    """Packed weights + the two forward primitives (see module docstring)."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"FastCausalLM cannot run this model: {reason}")
        cfg = model.config
        self.model = model
        self.device = device
        self.dtype = dtype
        attn0 = model.model.layers[0].self_attn
        self.nh = cfg.num_attention_heads
        self.kvh = getattr(cfg, "num_key_value_heads", None) or self.nh
        self.hd = getattr(attn0, "head_dim", None) or cfg.hidden_size // self.nh
        self.nrep = self.nh // self.kvh
        self.hidden = cfg.hidden_size
        self.nlayers = len(model.model.layers)
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.scaling = float(getattr(attn0, "scaling", self.hd ** -0.5))
        self.q_dim = self.nh * self.hd
        self.qk_dim = (self.nh + self.kvh) * self.hd
        self._cos: Optional[torch.Tensor] = None
        self._sin: Optional[torch.Tensor] = None
        self.pack()

    # ------------------------------------------------------------------------------ weights
    def pack(self) -> None:
        """(Re)read the model's weights (after a weight update)."""

        def t(x: torch.Tensor) -> torch.Tensor:
            return x.detach().to(self.device, self.dtype).contiguous()

        def t_opt(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if x is None else t(x)

        m = self.model
        layers = []
        with torch.no_grad():
            for layer in m.model.layers:
                a, mlp = layer.self_attn, layer.mlp
                bq = [getattr(p, "bias", None) for p in (a.q_proj, a.k_proj, a.v_proj)]
                if any(b is not None for b in bq):
                    outs = [p.weight.shape[0] for p in (a.q_proj, a.k_proj, a.v_proj)]
                    bqkv = t(torch.cat([b if b is not None else torch.zeros(o, dtype=a.q_proj.weight.dtype,
                                                                              device=a.q_proj.weight.device)
                                        for b, o in zip(bq, outs)]))
                else:
                    bqkv = None
                qkn = None
                if hasattr(a, "q_norm") and hasattr(a, "k_norm"):
                    qkn = t(torch.cat([a.q_norm.weight[None].expand(self.nh, -1),
                                       a.k_norm.weight[None].expand(self.kvh, -1)]))
                bg, bu = getattr(mlp.gate_proj, "bias", None), getattr(mlp.up_proj, "bias", None)
                g1 = layer.input_layernorm.weight.float()[None]
                g2 = layer.post_attention_layernorm.weight.float()[None]
                layers.append(_Layer(
                    wqkv=t(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).float() * g1),
                    bqkv=bqkv,
                    qkn=qkn,
                    wo=t(a.o_proj.weight),
                    bo=t_opt(getattr(a.o_proj, "bias", None)),
                    wgu=t(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).float() * g2),
                    bgu=t(torch.cat([bg, bu])) if bg is not None and bu is not None else None,
                    wd=t(mlp.down_proj.weight),
                    bd=t_opt(getattr(mlp.down_proj, "bias", None)),
                ))
            self.layers = layers
            self.emb = t(m.model.embed_tokens.weight)
            self.lm = t(m.lm_head.weight.float() * m.model.norm.weight.float()[None])
            self.lm_b = t_opt(getattr(m.lm_head, "bias", None))

    def rope(self, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin_signed)`` tables ``[n_pos, hd]`` from the model's rotary module.

        ``sin_signed = [-sin_lo, sin_hi]`` so that ``rope(x) = x * cos + roll(x, hd/2) * sin_signed``
        equals the model's ``x * cos + rotate_half(x) * sin``.
        """
        cos_table, sin_table = self._cos, self._sin
        if cos_table is None or sin_table is None or cos_table.shape[0] < n_pos:
            n = max(n_pos, 2 * (0 if cos_table is None else cos_table.shape[0]), 256)
            rot = self.model.model.rotary_emb
            ref = next(iter(rot.buffers()), None)
            rdev = ref.device if ref is not None else torch.device("cpu")
            with torch.no_grad():
                x = torch.zeros(1, dtype=self.dtype, device=rdev)
                cos, sin = rot(x, torch.arange(n, device=rdev)[None])
            cos = cos[0].to(self.device, self.dtype)
            sin = sin[0].to(self.device, self.dtype)
            half = self.hd // 2
            cos_table = cos.contiguous()
            sin_table = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous()
            self._cos, self._sin = cos_table, sin_table
        return cos_table, sin_table

    # ------------------------------------------------------------------------------ pieces
    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next matrix); float32 statistics."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), None, self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _qk_norm(self, qk: torch.Tensor, w: _Layer) -> torch.Tensor:
        if w.qkn is None:
            return qk
        return self._rms(qk) * w.qkn

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._rms(x), self.lm, self.lm_b).float()

    def _mlp(self, x: torch.Tensor, w: _Layer) -> torch.Tensor:
        h = self._rms(x)
        g, u = F.linear(h, w.wgu, w.bgu).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, w.wd, w.bd)

    # ------------------------------------------------------------------------------ prefill
    def prefill(self, ids: torch.Tensor, lens: torch.Tensor, past: Optional[torch.Tensor] = None,
                past_lens: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward new tokens after an optional past.

        ids: ``[n, Q]`` right-padded (row i's tokens are ``ids[i, :lens[i]]``); lens: ``[n]``.
        past: ``[L, 2, n, kvh, Pm, hd]`` left-padded (row i's ``past_lens[i]`` keys/values in the
        last columns) or None. Returns ``(kv [L, 2, n, kvh, Q, hd]`` of the new tokens (row i valid
        in ``[:lens[i]]``), ``logits [n, V]`` float32 at each row's last new token).
        Padded queries attend to themselves, so every value stays finite.
        """
        n, Q = ids.shape
        dev = ids.device
        j = torch.arange(Q, device=dev)
        if past is None:
            p0 = torch.zeros(n, dtype=torch.long, device=dev)
        elif past_lens is None:
            raise ValueError("prefill: a past needs its past_lens")
        else:
            p0 = past_lens
        qvalid = j[None] < lens[:, None]                                            # [n, Q]
        full = past is None and bool((lens == Q).all())
        mask = None
        if not full:
            new = (j[None, None, :] <= j[None, :, None]) & qvalid[:, None, :]
            new |= torch.eye(Q, dtype=torch.bool, device=dev)[None]
            if past is not None:
                Pm = past.shape[4]
                pv = torch.arange(Pm, device=dev)[None] >= (Pm - p0)[:, None]  # [n, Pm]
                new = torch.cat([pv[:, None, :].expand(n, Q, Pm), new], dim=2)
            mask = new[:, None]                                                   # [n, 1, Q, Pm + Q]
        # matmuls and elementwise ops run on the T real tokens only ("packed"); attention runs in
        # the padded [n, Q] layout, reached by two gathers per layer
        sel = qvalid.reshape(-1).nonzero().squeeze(1)                 # padded slot of each real token
        T = int(sel.shape[0])
        pad_map = torch.full((n * Q,), T, dtype=torch.long, device=dev)
        pad_map[sel] = torch.arange(T, device=dev)                    # T -> an appended zero row
        pad_map = pad_map.view(n, Q)
        pos = (p0[:, None] + j[None]).reshape(-1)[sel]                # [T]
        cos_t, sin_t = self.rope(int(pos.max()) + 1)
        cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]           # [T, 1, hd]
        kv = torch.empty(self.nlayers, 2, n, self.kvh, Q, self.hd, dtype=self.dtype, device=dev)
        x = F.embedding(ids.reshape(-1)[sel], self.emb)               # [T, H]
        half = self.hd // 2
        zero = torch.zeros(1, self.nh + 2 * self.kvh, self.hd, dtype=self.dtype, device=dev)
        for li, w in enumerate(self.layers):
            qkv = F.linear(self._rms(x), w.wqkv, w.bqkv)
            qk = self._qk_norm(qkv[:, : self.qk_dim].view(T, self.nh + self.kvh, self.hd), w)
            qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            heads = torch.cat([qk, qkv[:, self.qk_dim:].view(T, self.kvh, self.hd), ], dim=1)
            padded = torch.cat([heads, zero])[pad_map]                # [n, Q, nh + 2 kvh, hd]
            q = padded[:, :, : self.nh].transpose(1, 2)
            k = padded[:, :, self.nh: self.nh + self.kvh].transpose(1, 2)
            v = padded[:, :, self.nh + self.kvh:].transpose(1, 2)
            kv[li, 0] = k
            kv[li, 1] = v
            if past is not None:
                k = torch.cat([past[li, 0], k], dim=2)
                v = torch.cat([past[li, 1], v], dim=2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               scale=self.scaling, enable_gqa=self.nrep > 1)
            o = o.transpose(1, 2).reshape(n * Q, self.q_dim)[sel]
            x = x + F.linear(o, w.wo, w.bo)
            x = self._mlp(x, w)
        last = torch.cumsum(lens, 0) - 1
        return kv, self._logits(x[last])

    # ------------------------------------------------------------------------------ decode
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, buckets: list[Bucket], step: int) -> torch.Tensor:
        """Feed decoded token ``step - 1`` (``tokens [B]`` at ``positions [B]``) -> logits ``[B, V]``.

        Writes its keys/values at column ``context_width + step - 1`` of each bucket's cache.
        """
        batch_rows = tokens.shape[0]
        cos_table, sin_table = self.rope(int(positions.max()) + 1)
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]   # [B, 1, hd]
        hidden = F.embedding(tokens, self.emb)
        half = self.hd // 2
        single = len(buckets) == 1
        for layer_idx, weights in enumerate(self.layers):
            normed = self._rms(hidden)
            qkv = F.linear(normed, weights.wqkv, weights.bqkv)
            qk = self._qk_norm(qkv[:, : self.qk_dim].view(batch_rows, self.nh + self.kvh, self.hd), weights)
            qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            keys = qk[:, self.nh:]
            values = qkv[:, self.qk_dim:].view(batch_rows, self.kvh, self.hd)
            # GQA without repeating K/V: the nrep query heads of a kv head act as nrep queries
            queries = qk[:, : self.nh].reshape(batch_rows, self.kvh, self.nrep, self.hd)
            attn_parts = []
            for bucket in buckets:
                column = bucket.context_width + step - 1
                row_start, row_end = bucket.start, bucket.start + bucket.num_rows
                key_cache, value_cache = bucket.kv[layer_idx, 0], bucket.kv[layer_idx, 1]
                if single:
                    key_cache[:, :, column] = keys
                    value_cache[:, :, column] = values
                    bucket_queries = queries
                else:
                    key_cache[:, :, column] = keys[row_start:row_end]
                    value_cache[:, :, column] = values[row_start:row_end]
                    bucket_queries = queries[row_start:row_end]
                attn_mask = None if bucket.mask is None else bucket.mask[..., : column + 1]
                attn_parts.append(F.scaled_dot_product_attention(
                    bucket_queries, key_cache[:, :, : column + 1], value_cache[:, :, : column + 1],
                    attn_mask=attn_mask, scale=self.scaling))
            attn_out = attn_parts[0] if single else torch.cat(attn_parts)
            hidden = hidden + F.linear(attn_out.reshape(batch_rows, self.q_dim), weights.wo, weights.bo)
            hidden = self._mlp(hidden, weights)
        return self._logits(hidden)

    # ------------------------------------------------------------------------------ checks
    @torch.no_grad()
    def verify(self, tol: Optional[float] = None) -> float:
        """Max |logit difference| vs ``model(...)`` on a small batch; raises if > tol.

        Also checks that prefilling in two pieces (a past, then the rest) gives the same logits."""
        dev = self.device
        vocab = self.emb.shape[0]
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, vocab, (2, 7), generator=g).to(dev)
        lens = torch.full((2,), 7, dtype=torch.long, device=dev)
        kv, fast = self.prefill(ids, lens)
        past = kv[..., :3, :]
        _, split = self.prefill(ids[:, 3:], lens - 3, past, torch.full((2,), 3, dtype=torch.long, device=dev))
        mdev = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            ref = self.model(input_ids=ids.to(mdev)).logits[:, -1].float().to(dev)
        finally:
            self.model.train(was_training)
        diff = float(torch.maximum((fast - ref).abs().max(), (split - ref).abs().max()))
        if tol is None:
            tol = 1e-3 if self.dtype == torch.float32 else 0.25
        scale = 1.0 + float(ref.abs().max())
        if not diff <= tol * scale:
            raise ValueError(f"fast forward disagrees with the model by {diff:.3g} (> {tol * scale:.3g})")
        return diff
