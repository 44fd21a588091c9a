"""The models: the V4 shape and its weights, the reference forward and the math it shares with the
engine, the Llama and Gemma 3 families, GGUF import, drafts and the vision encoder.

This package re-exports nothing: import the module you need (``dsi.model.config``,
``dsi.model.ops``, ...), so that a torch-free one does not pull in the others.
"""
