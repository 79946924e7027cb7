"""Sentence-embedding methods: one family per module, each registered under its method names (jaxemb/methods/base.py
says what a family owns). Adding a method is a module, its tests and an import line below, which registers it."""

# The families, in the order of `names()` (and so of the methods listed in error messages).
from jaxemb.methods import base
from jaxemb.methods import pooled
from jaxemb.methods import static
from jaxemb.methods import ditto
from jaxemb.methods import tfidf
from jaxemb.methods import prompt
from jaxemb.methods import whitening
from jaxemb.methods import flow
from jaxemb.methods.base import Method, NotExportable, exportable_names, names

__all__ = [
  "Method",
  "NotExportable",
  "base",
  "ditto",
  "exportable_names",
  "flow",
  "names",
  "pooled",
  "prompt",
  "static",
  "tfidf",
  "whitening",
]
