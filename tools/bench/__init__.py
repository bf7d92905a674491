"""Cleave's benchmark load generator for any OpenAI-compatible endpoint (see main.py)."""
