"""Analyses of trained runs: perplexity vs length (eval), head analysis, attention maps."""
