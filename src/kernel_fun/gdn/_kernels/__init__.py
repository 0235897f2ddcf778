"""gdn's own Triton kernels, one stage per file (the state scans are ``_delta``'s)."""
