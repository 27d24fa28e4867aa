"""Sample clips for framebatch: generated test clips and tooling to fetch real ones."""
