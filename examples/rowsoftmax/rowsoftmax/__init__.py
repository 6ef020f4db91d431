"""A row softmax family for kda-fuzz, worked from scratch (docs/extending.md)."""
