"""Quantization and precision variants of built graphs (issue 4); see variants.py for the entry point."""
