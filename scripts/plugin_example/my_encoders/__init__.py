"""Positional encodings of my own, used by posexp without a fork (see ../README.md)."""
