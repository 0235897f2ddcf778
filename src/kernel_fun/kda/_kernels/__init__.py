"""KDA's Triton kernels, one stage per file (the per-channel gate's stages that only KDA has;
the state scans and the score gradient are the engine's, ``kernel_fun._delta._kernels``).

- ``intra_bwd``: the intra-chunk backward (drop-in for fla's ``chunk_kda_bwd_intra``), with the
  l2norm backward of q, k in its epilogue when HV == H.
- ``wy_bwd``: the WY / state-gradient backward (drop-in for fla's ``chunk_kda_bwd_wy_dqkg_fused``).
- ``gate_bwd``: dg's chunk-local reverse cumsum and the KDA gate's backward in one pass.

Gates are cumsummed inside each 64-token chunk in log2 units (``g = RCP_LN2 * cumsum(log
decay)``, so ``exp2(g_i - g_j) = exp(G_i - G_j)``); grids and metadata: ``_delta/chunking.py``.
"""
