"""Pure: the diagnosis's stages, each a small function of the evidence (and of the stages before it)."""
