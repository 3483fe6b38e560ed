"""Per-backend pod mutations (pure): SGLang command flags, NIXL/RDMA wiring."""
