"""The chunked delta-rule engine that ``kda`` and ``gdn`` are front-ends of.

KDA (Kimi Delta Attention, a per-channel gate ``gk [B, T, HV, K]``) and Gated DeltaNet (a
scalar per-head gate ``g [B, T, HV]``) are the same recurrence

    S_t = diag(a_t) S_{t-1} + beta_t k_t (v_t - k_t^T diag(a_t) S_{t-1})^T,   o_t = scale S_t^T q_t

computed chunk by chunk (WY/UT form). The stages live here once, parameterized by the gate
kind; the families only classify calls and wire the stages together.

- ``reference``: plain-torch fp64 references (the chunked stages and the token-by-token
  recurrence) that the kernels are held to.
- ``_kernels.state_scan_fwd``: the forward state scan that also produces ``o``.
- ``_kernels.state_scan_bwd``: the backward state scan (state gradients and the full dv).
- ``_kernels.score_grad``: the score gradient dAqk alone (with a precomputed Aqk: KDA).
- ``gate``: the in-op gate ``-exp(A_log) softplus(g_raw + dt_bias)`` and its backward, as
  Triton helpers (KDA's gate backward, GDN's inputs kernels).
- ``chunking``: chunk metadata of packed documents (``cu_seqlens``), the grids, and what one
  program of a chunk-parallel stage or of a scan owns.

Configurations, the forced-config launcher and the NaN-poison allocation: ``_common/tuning.py``.
"""
