"""Chunked autograd kernels over a vocabulary: per-token log-probs and entropies of (B, T, V) logits, and of final
hidden states through the LM head (the fused head), without ever holding a (B, T, V) fp32 tensor.

Shapes: B sequences, T positions, V vocabulary, H hidden, N = B·T rows. τ is the sampling temperature.

Formulas (one line each, with the source):
- log p(y_t) = z_t[y_t]/τ − logsumexp(z_t/τ)                         (softmax with temperature τ, as `generate` samples)
- d log p / dz = (onehot(y) − softmax(z/τ)) / τ                          (derivative of log-softmax)
- entropy H = logsumexp(z/τ) − Σ_v softmax(z/τ)_v · z_v/τ               (definition; verl `entropy_from_logits`)
- dH/dz = −p·(z/τ − E_p[z/τ]) / τ                                         (derivative of the above)
- fused head: z = h·Wᵀ per chunk of rows; dh = dz·W, dW = Σ_chunks dzᵀ·h      (chain rule through the linear head)

Each kernel works in chunks of rows with fp32 accumulation (fp64 for fp64 inputs), and backward recomputes the
softmax per chunk instead of saving it, so the largest fp32 temporary is chunk × V. Tensors in, tensors out: the
model is run by grpo/models/logprobs.py (training and log-prob passes); the losses are grpo/core/losses.py's.
"""

from __future__ import annotations

import torch

DEFAULT_LOGPROB_CHUNK_ROWS = 512
"""Rows (tokens) per logsumexp chunk: 512 rows × 152k vocabulary (Qwen) × 4 bytes ≈ 310 MB of fp32 temporaries,
small next to the bf16 logits themselves yet large enough that the Python loop costs nothing."""
DEFAULT_ENTROPY_CHUNK_ROWS = 512
"""Rows (tokens) per chunk when computing entropy: 512 rows × 152k vocabulary × 4 bytes ≈ 310 MB of fp32 temporaries."""


KEEP_LOG_SOFTMAX_BYTES = 512 * 2**20
"""The fused head keeps its forward's fp32 log-softmax chunks for backward, instead of recomputing them from the
hidden states, when they total at most this many bytes and live in host memory. Recomputing costs a head product
as large as the forward's (keeping is faster on SmolLM2's head: `python -m benchmarks.real_model_parts`, its timings
in benchmarks/RESULTS.md), while host memory is plentiful: 512 MiB holds 2,700 rows at a 49k
vocabulary, 880 at Qwen's 152k. On an accelerator the fused head exists to save memory, so it always recomputes
there."""


def row_chunks(shape_BT: tuple[int, int], chunk_rows: int):
    """(batch slice, time slice) pairs covering a (B, T) grid with at most ~`chunk_rows` cells each.

    Works on views (e.g. `logits[:, :-1]`) without flattening, so no copy of the (B, T, V) tensor is made.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_size={chunk_rows} must be ≥ 1 (rows of logits processed at once)")
    B, T = shape_BT
    if T == 0 or B == 0:
        return
    if T >= chunk_rows:
        for b in range(B):
            for t0 in range(0, T, chunk_rows):
                yield slice(b, b + 1), slice(t0, t0 + chunk_rows)
    else:
        per = chunk_rows // T
        for b0 in range(0, B, per):
            yield slice(b0, b0 + per), slice(0, T)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 inputs, fp64 for fp64 inputs: chunked reductions never accumulate below fp32."""
    return torch.promote_types(dtype, torch.float32)


def scaled_chunk(chunk: torch.Tensor, dtype: torch.dtype, temperature: float, fresh: bool = False) -> torch.Tensor:
    """A fresh `dtype` copy of `chunk` divided by `temperature` in place: one temporary per chunk, never two.
    `fresh`: `chunk` is a temporary of its own (a head product), used in place when it already has `dtype`."""
    z = chunk.to(dtype, copy=not fresh)
    return z if temperature == 1.0 else z.div_(temperature)


def _softmax_statistics(logits_BTV: torch.Tensor, temperature: float, chunk_rows: int,
                        with_mean: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logsumexp(z/τ) per row and, `with_mean`, E_p[z/τ] = Σ softmax(z/τ)·z/τ, each (B, T) in the accumulation
    dtype, computed row chunk by row chunk: the forward half of the chunked kernels below."""
    B, T, _ = logits_BTV.shape
    acc = accumulation_dtype(logits_BTV.dtype)
    lse_BT = logits_BTV.new_empty((B, T), dtype=acc)
    mean_BT = logits_BTV.new_empty((B, T), dtype=acc) if with_mean else None
    for bs, ts in row_chunks((B, T), chunk_rows):
        z = scaled_chunk(logits_BTV[bs, ts], acc, temperature)
        lse = torch.logsumexp(z, dim=-1)
        lse_BT[bs, ts] = lse
        if with_mean:
            mean_BT[bs, ts] = (torch.exp(z - lse.unsqueeze(-1)) * z).sum(-1)
    return lse_BT, mean_BT


def _chunked_gradient(logits_BTV: torch.Tensor, lse_BT: torch.Tensor, temperature: float, chunk_rows: int,
                      chunk_grad) -> torch.Tensor:
    """The logits' gradient written chunk by chunk into one tensor of their dtype: `chunk_grad(bs, ts, z)` gives a
    chunk's gradient from its fresh z/τ (in the accumulation dtype; the softmax is recomputed from it, not saved):
    the backward half of the chunked kernels below."""
    grad_BTV = torch.empty_like(logits_BTV)
    for bs, ts in row_chunks(tuple(lse_BT.shape), chunk_rows):
        grad_BTV[bs, ts] = chunk_grad(bs, ts, scaled_chunk(logits_BTV[bs, ts], lse_BT.dtype, temperature))
    return grad_BTV


class _ChunkedTokenLogProb(torch.autograd.Function):
    """log p(y) = z_y/τ − logsumexp(z/τ) in fp32 row chunks. Backward writes d/dz = (onehot(y) − softmax(z/τ))·g/τ
    chunk by chunk straight into one gradient tensor of the logits' dtype; the softmax is recomputed, not saved."""

    @staticmethod
    def forward(ctx, logits_BTV: torch.Tensor, target_ids_BT: torch.Tensor, temperature: float,
                chunk_rows: int) -> torch.Tensor:
        lse_BT, _ = _softmax_statistics(logits_BTV, temperature, chunk_rows, with_mean=False)
        target_BT1 = target_ids_BT.long().unsqueeze(-1)
        target_logit_BT = logits_BTV.gather(-1, target_BT1).squeeze(-1).to(lse_BT.dtype) / temperature
        ctx.save_for_backward(logits_BTV, target_BT1, lse_BT)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return target_logit_BT - lse_BT

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_BT: torch.Tensor):
        logits_BTV, target_BT1, lse_BT = ctx.saved_tensors
        tau = ctx.temperature

        def chunk_grad(bs: slice, ts: slice, z: torch.Tensor) -> torch.Tensor:
            g_bt1 = grad_BT[bs, ts].to(lse_BT.dtype).unsqueeze(-1) / tau
            p = z.sub_(lse_BT[bs, ts].unsqueeze(-1)).exp_()
            return p.mul_(-g_bt1).scatter_add_(-1, target_BT1[bs, ts], g_bt1)

        return _chunked_gradient(logits_BTV, lse_BT, tau, ctx.chunk_rows, chunk_grad), None, None, None


class _FusedHeadLogProb(torch.autograd.Function):
    """Log-probs (and entropies) of targets straight from the final hidden states and the LM-head weight, in row
    chunks: z = h·Wᵀ (in the weights' dtype, as the model's own head computes it), then fp32 softmax statistics.
    The (N, V) logits exist one chunk at a time, in forward and in backward (recomputed), never whole; on the CPU,
    up to KEEP_LOG_SOFTMAX_BYTES, the forward's log-softmax chunks (and their softmax, when the entropy was computed)
    are kept for backward instead (the same values, without a second head product or exp).

        d/dz = g_lp·(onehot(y) − p)/τ − g_H·p·(log p + H)/τ          dh = d/dz · W        dW = Σ_chunks (d/dz)ᵀ · h
    """

    @staticmethod
    def forward(ctx, hidden_NH: torch.Tensor, weight_VH: torch.Tensor, target_N: torch.Tensor, temperature: float,
                chunk_rows: int, with_entropy: bool, keep: bool):
        acc = accumulation_dtype(hidden_NH.dtype)
        N = hidden_NH.shape[0]
        logp_N = hidden_NH.new_empty(N, dtype=acc)
        entropy_N = hidden_NH.new_zeros(N, dtype=acc)
        kept: list[torch.Tensor] = []
        for s in range(0, N, chunk_rows):
            z = scaled_chunk(hidden_NH[s:s + chunk_rows] @ weight_VH.T, acc, temperature, fresh=True)
            lse = torch.logsumexp(z, dim=-1)
            logp_N[s:s + chunk_rows] = z.gather(-1, target_N[s:s + chunk_rows, None]).squeeze(-1) - lse
            if with_entropy or keep:
                logp_all = z.sub_(lse[:, None])  # log softmax, in place (z is not needed after this)
                p_all = logp_all.exp() if with_entropy else None
                if with_entropy:
                    entropy_N[s:s + chunk_rows] = -(p_all * logp_all).sum(-1)
                if keep:  # with the softmax when the entropy made it: backward then needs no exp of its own
                    kept.append((logp_all, p_all))
        ctx.save_for_backward(hidden_NH, weight_VH, target_N)
        ctx.kept = kept  # empty: backward recomputes each chunk
        ctx.temperature, ctx.chunk_rows, ctx.with_entropy = temperature, chunk_rows, with_entropy
        # an output the loss does not use (the metric-only entropy at entropy_coef = 0) gets None, not zeros: its
        # term is skipped in backward instead of adding three vocabulary-wide products of 0 per chunk
        ctx.set_materialize_grads(False)
        return logp_N, entropy_N

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp_N: torch.Tensor, grad_entropy_N: torch.Tensor):
        hidden_NH, weight_VH, target_N = ctx.saved_tensors
        acc, tau = accumulation_dtype(hidden_NH.dtype), ctx.temperature
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden_NH) if want_h else None
        grad_w = None  # the first chunk's product, then each later chunk added in place (no zeros, no temporary)
        use_entropy = ctx.with_entropy and grad_entropy_N is not None
        use_logp = grad_logp_N is not None
        for i, s in enumerate(range(0, hidden_NH.shape[0], ctx.chunk_rows)):
            h = hidden_NH[s:s + ctx.chunk_rows]
            p = None
            if ctx.kept:
                logp, p = ctx.kept[i]
            else:
                z = scaled_chunk(h @ weight_VH.T, acc, tau, fresh=True)
                logp = z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))  # log softmax, in place
            if p is None:
                p = logp.exp()
            if use_logp:
                g_lp = grad_logp_N[s:s + ctx.chunk_rows].to(acc)[:, None]
                dz = p * -g_lp
            else:
                dz = torch.zeros_like(p)
            if use_entropy:
                H = -(p * logp).sum(-1, keepdim=True)
                dz -= grad_entropy_N[s:s + ctx.chunk_rows].to(acc)[:, None] * p * (logp + H)
            if use_logp:
                dz.scatter_add_(-1, target_N[s:s + ctx.chunk_rows, None], g_lp)
            dz.div_(tau)
            dz = dz.to(hidden_NH.dtype)
            if want_h:
                grad_h[s:s + ctx.chunk_rows] = dz @ weight_VH
            if want_w:
                if grad_w is None:
                    grad_w = (dz.T @ h).to(acc)
                elif dz.dtype == acc:
                    grad_w.addmm_(dz.T, h)
                else:
                    grad_w += (dz.T @ h).to(acc)
        ctx.kept = []
        return grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype), None, None, None, None, None


def head_logprobs(hidden_BTH: torch.Tensor, weight_VH: torch.Tensor, target_ids_BT: torch.Tensor,
                  temperature: float = 1.0, with_entropy: bool = False,
                  chunk_size: int = DEFAULT_LOGPROB_CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(target), entropy or None), each (B, T) fp32, from final hidden states and a bias-free LM head weight;
    differentiable in both. Peak extra memory: one chunk_size × V logits chunk (fp32 and the weights' dtype); on
    the CPU, when a backward will follow, up to KEEP_LOG_SOFTMAX_BYTES of kept log-softmax chunks."""
    B, T, H = hidden_BTH.shape
    if weight_VH.dim() != 2 or weight_VH.shape[1] != H or target_ids_BT.shape != (B, T):
        raise ValueError(f"head_logprobs: hidden {tuple(hidden_BTH.shape)}, weight {tuple(weight_VH.shape)} and "
                         f"targets {tuple(target_ids_BT.shape)} do not fit (B, T, H), (V, H), (B, T)")
    if temperature <= 0:
        raise ValueError(f"head_logprobs: temperature={temperature} must be > 0 (the sampling temperature)")
    kept_tensors = 2 if with_entropy else 1  # the log-softmax, and the softmax the entropy computes anyway
    keep = (torch.is_grad_enabled() and (hidden_BTH.requires_grad or weight_VH.requires_grad)
            and hidden_BTH.device.type == "cpu"
            and kept_tensors * B * T * weight_VH.shape[0] * torch.finfo(accumulation_dtype(hidden_BTH.dtype)).bits
            // 8 <= KEEP_LOG_SOFTMAX_BYTES)
    logp_N, entropy_N = _FusedHeadLogProb.apply(hidden_BTH.reshape(B * T, H), weight_VH,
                                                 target_ids_BT.reshape(-1).long(), float(temperature),
                                                 int(chunk_size), bool(with_entropy), keep)
    return logp_N.view(B, T), entropy_N.view(B, T) if with_entropy else None


def token_logprobs(logits_BTV: torch.Tensor, target_ids_BT: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int = DEFAULT_LOGPROB_CHUNK_ROWS) -> torch.Tensor:
    """log softmax(logits/temperature)[target] per position, shape (B, T), differentiable; fp32 (fp64 for fp64 logits).

    `logits_BTV` may be a non-contiguous view (e.g. `logits[:, :-1]`): it is never flattened or copied. Extra memory:
    one chunk_size × V fp32 temporary in forward; in backward, that plus the logits' gradient (one tensor).
    """
    if logits_BTV.dim() != 3 or target_ids_BT.shape != logits_BTV.shape[:2]:
        raise ValueError(f"token_logprobs: need logits (B, T, V) and targets (B, T); got "
                         f"{tuple(logits_BTV.shape)} and {tuple(target_ids_BT.shape)}")
    if temperature <= 0:
        raise ValueError(f"token_logprobs: temperature={temperature} must be > 0 (the sampling temperature)")
    return _ChunkedTokenLogProb.apply(logits_BTV, target_ids_BT, float(temperature), int(chunk_size))


class _ChunkedEntropy(torch.autograd.Function):
    """H = logsumexp(z/τ) − Σ p·z/τ in fp32 chunks; backward dH/dz = −p·(z/τ − E_p[z/τ])/τ, recomputed per chunk,
    so only the input logits (already alive) and two (B, T) vectors are kept for backward."""

    @staticmethod
    def forward(ctx, logits_BTV: torch.Tensor, temperature: float, chunk_rows: int) -> torch.Tensor:
        lse_BT, mean_BT = _softmax_statistics(logits_BTV, temperature, chunk_rows, with_mean=True)
        ctx.save_for_backward(logits_BTV, lse_BT, mean_BT)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return lse_BT - mean_BT

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_BT: torch.Tensor):
        logits_BTV, lse_BT, mean_BT = ctx.saved_tensors

        def chunk_grad(bs: slice, ts: slice, z: torch.Tensor) -> torch.Tensor:
            p = torch.exp(z - lse_BT[bs, ts].unsqueeze(-1))
            g = -p * (z - mean_BT[bs, ts].unsqueeze(-1)) * (grad_BT[bs, ts].to(lse_BT.dtype).unsqueeze(-1)
                                                            / ctx.temperature)
            return g.to(logits_BTV.dtype)

        return _chunked_gradient(logits_BTV, lse_BT, ctx.temperature, ctx.chunk_rows, chunk_grad), None, None


def entropy_from_logits(logits_BTV: torch.Tensor, chunk_size: int = DEFAULT_ENTROPY_CHUNK_ROWS,
                        temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of softmax(logits/temperature) per position, shape (B, T), fp32 (fp64 for fp64 logits).

    Computed in chunks of `chunk_size` rows with fp32 accumulation; never materialises a (B, T, V) fp32 tensor,
    in forward or backward (gradients are supported for an entropy bonus).
    """
    if logits_BTV.dim() != 3:
        raise ValueError(f"entropy_from_logits: logits must be (B, T, V), got shape {tuple(logits_BTV.shape)}")
    if temperature <= 0:
        raise ValueError(f"entropy_from_logits: temperature={temperature} must be > 0")
    return _ChunkedEntropy.apply(logits_BTV, float(temperature), int(chunk_size))
